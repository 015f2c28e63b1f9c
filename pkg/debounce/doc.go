// Package debounce merges bursts of changes: values added with Add are
// merged, and handed on once no value arrived for a quiet period, or once
// the first pending value has waited the maximum delay, whichever comes
// first.
//
// Add never blocks and is safe for concurrent use. Run calls its function
// from its own goroutine, one call at a time; values added while the
// function runs wait for the next round. Run returns when its context is
// done. Time comes from a Clock, so tests can control it (or run inside
// testing/synctest).
package debounce
