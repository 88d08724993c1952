package grpclimit

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/metadata"
)

// Metadata given no name fails every call with ErrInvalidConfig (Internal),
// and PriorityMetadata refuses it: before, a key named "" was never found,
// so the rule never applied and the method ran unlimited without a word.
func TestEmptyNamesRefused(t *testing.T) {
	t.Parallel()
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-key", "k"))
	if _, err := Metadata("")(ctx, "/s/m"); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Metadata(\"\") key = %v, want ErrInvalidConfig", err)
	}
	if _, err := PriorityMetadata(" ", nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("PriorityMetadata(\" \") = %v, want ErrInvalidConfig", err)
	}
}
