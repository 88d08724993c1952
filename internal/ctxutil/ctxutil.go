// Package ctxutil holds what the stores share about contexts.
package ctxutil

import "context"

// OrBackground is ctx, or context.Background() for a nil one, which every
// store call takes for it (as the memory store does) rather than panic.
func OrBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}
