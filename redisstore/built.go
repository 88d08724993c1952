package redisstore

import "github.com/sluicehq/sluice"

var _ sluice.BuildChecker = (*Store)(nil)

// CheckBuilt implements sluice.BuildChecker: ErrNoClient for a zero or nil
// Store, or one made with a nil client; ErrInvalidOptions for one made
// with invalid Options; nil otherwise. It does not call Redis.
func (s *Store) CheckBuilt() error {
	if s == nil || s.client == nil {
		return s.unbuilt()
	}
	return nil
}

var _ sluice.BuildChecker = (*Membership)(nil)

// CheckBuilt implements sluice.BuildChecker: ErrNoClient for a zero or nil
// Membership, or one of a Store without a client (its ErrInvalidOptions
// when it refused its Options); nil otherwise. It does not call Redis.
func (m *Membership) CheckBuilt() error {
	if m == nil || m.client == nil {
		return m.unbuilt()
	}
	return nil
}
