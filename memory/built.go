package memory

import "github.com/sluicehq/sluice"

var _ sluice.BuildChecker = (*Store)(nil)

// CheckBuilt implements sluice.BuildChecker: ErrZeroStore for a zero or
// nil Store, nil for one made by New.
func (s *Store) CheckBuilt() error {
	if s.zero() {
		return s.unbuilt()
	}
	return nil
}
