package resilient

import (
	"fmt"

	"github.com/sluicehq/sluice"
)

var (
	_ sluice.BuildChecker = (*Store)(nil)
	_ sluice.BuildChecker = (*MultiStore)(nil)
)

// CheckBuilt implements sluice.BuildChecker: ErrZeroStore for a zero or
// nil Store, else the backend's and the fallback's verdicts (see
// sluice.CheckBuilt). It calls neither.
func (s *Store) CheckBuilt() error {
	if s == nil || s.backend == nil {
		return ErrZeroStore
	}
	if err := sluice.CheckBuilt(s.backend); err != nil {
		return fmt.Errorf("resilient: backend: %w", err)
	}
	if s.fallback != nil {
		if err := sluice.CheckBuilt(s.fallback); err != nil {
			return fmt.Errorf("resilient: fallback: %w", err)
		}
	}
	return nil
}

// CheckBuilt is Store.CheckBuilt.
func (m *MultiStore) CheckBuilt() error { return m.store().CheckBuilt() }
