// Package telemetry holds what every shardpilot process shares for being
// operated: the slog logger, the Prometheus registry, readiness tracking, and
// the admin HTTP server (/healthz, /readyz, /metrics, /debug/...).
//
// Nothing here is global: a process builds one Registry and one Readiness and
// passes them to the parts that report into them. Readiness is safe for
// concurrent use. Admin.Run returns once its server has shut down.
package telemetry
