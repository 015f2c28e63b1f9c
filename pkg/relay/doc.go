// Package relay publishes every change committed under /mesh/v1/ in the store
// to the bus, in revision order.
//
// The relay keeps no state of its own: the last event in the stream says
// where it stopped, so after a crash it resumes right after the last event
// it published, and the bus de-duplicates by revision anything it repeats.
// When the store has compacted the revisions it needs, or the stream is
// empty, it publishes a RESYNC event so that consumers reload from the store.
//
// Run blocks until its context is done and returns only after its watch has
// stopped. Run one relay per store (the ingester elects it); two relays
// running at once double nothing, thanks to the de-duplication ids.
package relay
