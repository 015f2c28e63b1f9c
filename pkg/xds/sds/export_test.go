package sds

import "time"

// SetReviews makes the held identities' authorization asked every every
// and remembered for remember, until the returned function restores them.
func SetReviews(every, remember time.Duration) (restore func()) {
	e, r := reviewEvery, reviewFor
	reviewEvery, reviewFor = every, remember
	return func() { reviewEvery, reviewFor = e, r }
}
