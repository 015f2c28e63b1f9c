// Package debounce merges bursts of changes: values added with Add are
// merged, and handed on once no value arrived for a quiet period, or once
// the first pending value has waited the maximum delay, whichever comes
// first.
//
// A Debouncer has no goroutine and no lock: it belongs to one goroutine
// (the pusher's owner loop), which adds values with the time they arrived,
// and asks Poll, when it has nothing else to do, whether the merged value
// is due and otherwise how long to sleep before asking again. Time is
// passed in, so tests control it.
package debounce
