// Package zookeeper is the source of services registered in ZooKeeper: by
// Apache Dubbo (a provider URL per ephemeral node under
// /dubbo/<interface>/providers) and by Apache Curator's service discovery,
// as Spring Cloud ZooKeeper uses it (a JSON instance per ephemeral node
// under /services/<name>/<id>).
//
// Each Dubbo interface, or Curator service, becomes a normalized Service
// and the Endpoints of its providers or instances, written through an
// ingest.Syncer like every other source. Hostnames follow a template,
// "{service}.{namespace}.svc.{domain}" by default: {service} is the
// interface (lowercased) or the Curator service name, {namespace} the
// provider's "namespace" parameter (Curator: metadata "namespace") or the
// source's default namespace, {domain} the domain suffix. An endpoint's
// labels come from its URL parameters (version, group, application as
// "app" and "application", dubbo.tag) or its Curator metadata, so that
// DestinationRule subsets and VirtualService routes select them.
//
// Dubbo protocols map to service ports: tri (triple) and grpc are gRPC,
// dubbo is TCP, http and rest are HTTP; the port is the one most providers
// of the interface listen on (a service keeps the port it has in the
// store while a provider listens on it, across restarts, so that one
// joining on another port does not move the clients), and each endpoint
// keeps its own. Providers of
// one interface that speak another protocol than most of them are
// reported, not served: one service port cannot reach them. A provider
// with enabled=false or disabled=true stays an endpoint, unhealthy; its
// weight parameter is its load-balancing weight.
//
// The source watches (ZooKeeper's one-shot watches, re-armed on every
// read): the roots' children, each interface's providers and each Curator
// service's instances and their data. An event marks its interface or
// service; a sync reads and writes only those. A new session (the old one
// expired) reads everything again, since its watches are gone; a
// reconnection within the session keeps them, and ZooKeeper replays what
// changed meanwhile. A read that fails (ZooKeeper unreachable) writes
// nothing: the store keeps every endpoint until ZooKeeper answers again.
//
// Bad data is one problem per node, with its path and why (an undecodable
// URL, an instance without address, a port out of range); the other
// providers of the interface flow.
package zookeeper
