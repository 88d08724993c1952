package lease

import (
	"fmt"

	"github.com/sluicehq/sluice"
)

var _ sluice.BuildChecker = (*Store)(nil)

// CheckBuilt implements sluice.BuildChecker: ErrNoGranter for a zero or
// nil Store, the granter's own verdict for one made by New.
func (s *Store) CheckBuilt() error {
	if s == nil || s.granter == nil {
		return ErrNoGranter
	}
	if err := sluice.CheckBuilt(s.granter); err != nil {
		return fmt.Errorf("lease: granter: %w", err)
	}
	return nil
}
