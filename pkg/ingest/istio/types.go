package istio

import "encoding/json"

// These types mirror the specs of Istio's networking API as written in YAML
// (camelCase JSON names). Fields shardpilot does not act on yet are kept as
// json.RawMessage so that valid Istio resources decode, strictly; each one
// set is a warning naming it (see ignoredFields), never dropped in silence.

// Resource is one Kubernetes-style resource document.
type Resource struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   Metadata        `json:"metadata"`
	Spec       json.RawMessage `json:"spec"`
	Status     json.RawMessage `json:"status,omitempty"`
	// Data is a ConfigMap's.
	Data map[string]string `json:"data,omitempty"`
}

// Metadata is the part of Kubernetes object metadata the normalizer reads.
type Metadata struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace"`
	Labels          map[string]string `json:"labels"`
	ResourceVersion string            `json:"resourceVersion"`
}

type serviceEntry struct {
	Hosts            []string        `json:"hosts"`
	Addresses        []string        `json:"addresses" field:"supported: single addresses are virtual IPs (sidecar domains, a TCP listener each); a CIDR range is warned"`
	Ports            []servicePort   `json:"ports"`
	Location         string          `json:"location" field:"supported: MESH_INTERNAL services get Istio's mutual TLS to endpoints with a sidecar (enableAutoMtls); MESH_EXTERNAL, the default, never unasked"`
	Resolution       string          `json:"resolution" field:"supported: NONE, STATIC, DNS (STRICT_DNS clusters), DNS_ROUND_ROBIN (LOGICAL_DNS)"`
	Endpoints        []workloadEntry `json:"endpoints"`
	WorkloadSelector *workloadSelect `json:"workloadSelector"`
	ExportTo         []string        `json:"exportTo"`
	SubjectAltNames  json.RawMessage `json:"subjectAltNames"`
}

type servicePort struct {
	Number     uint32 `json:"number"`
	Protocol   string `json:"protocol"`
	Name       string `json:"name"`
	TargetPort uint32 `json:"targetPort"`
}

type workloadSelect struct {
	Labels map[string]string `json:"labels"`
}

type workloadEntry struct {
	Address        string            `json:"address"`
	Ports          map[string]uint32 `json:"ports"`
	Labels         map[string]string `json:"labels"`
	Network        json.RawMessage   `json:"network"`
	Locality       string            `json:"locality" field:"supported: region/zone/subzone, for locality load balancing"`
	Weight         uint32            `json:"weight"`
	ServiceAccount string            `json:"serviceAccount"`
}

// workloadGroup is a WorkloadGroup: with the Kubernetes source and the
// bus, each workload whose agent connects naming it gets a WorkloadEntry
// (see kube.Registrar).
type workloadGroup struct {
	Metadata struct {
		Labels      map[string]string `json:"labels" field:"supported: on each registered workload's entry, under its agent's labels"`
		Annotations map[string]string `json:"annotations" field:"supported: on each registered workload's entry"`
	} `json:"metadata"`
	Template *workloadEntry  `json:"template" field:"supported: each registered workload's entry, with the workload's address, network and locality; its identity must be the template's service account (any of the namespace's without one)"`
	Probe    json.RawMessage `json:"probe" field:"warned: readiness is not probed; registered workloads are served healthy"`
}

type virtualService struct {
	Hosts    []string    `json:"hosts"`
	Gateways []string    `json:"gateways"`
	HTTP     []httpRoute `json:"http"`
	TLS      []l4Route   `json:"tls"`
	TCP      []l4Route   `json:"tcp"`
	ExportTo []string    `json:"exportTo"`
}

// l4Route is a tcp or a tls route; sniHosts belong to tls matches alone
// (the normalizer refuses them in a tcp route).
type l4Route struct {
	Match []l4Match       `json:"match"`
	Route []l4Destination `json:"route"`
}

type l4Match struct {
	SniHosts           []string          `json:"sniHosts" field:"supported: in tls routes (refused in a tcp route)"`
	DestinationSubnets json.RawMessage   `json:"destinationSubnets" field:"warned: the match alternative never matches"`
	Port               uint32            `json:"port"`
	SourceLabels       map[string]string `json:"sourceLabels" field:"supported: by the class of the proxy (its labels); at gateways it never matches"`
	Gateways           []string          `json:"gateways"`
	SourceNamespace    string            `json:"sourceNamespace" field:"supported: at sidecars, by the class's namespace; at gateways it never matches"`
}

type l4Destination struct {
	Destination destination `json:"destination"`
	Weight      int32       `json:"weight"`
}

type httpRoute struct {
	Name             string             `json:"name"`
	Match            []httpMatchRequest `json:"match"`
	Route            []routeDestination `json:"route"`
	Redirect         *httpRedirect      `json:"redirect"`
	DirectResponse   *directResponse    `json:"directResponse" field:"supported: proxyless gRPC clients fail those RPCs (grpc-go has no direct responses)"`
	Delegate         *delegate          `json:"delegate"`
	Rewrite          *httpRewrite       `json:"rewrite"`
	Timeout          string             `json:"timeout"`
	Retries          *httpRetry         `json:"retries"`
	Fault            *httpFault         `json:"fault"`
	Mirror           *destination       `json:"mirror"`
	Mirrors          json.RawMessage    `json:"mirrors"`
	MirrorPercentage *percent           `json:"mirrorPercentage"`
	MirrorPercent    json.RawMessage    `json:"mirrorPercent"`
	CorsPolicy       *corsPolicy        `json:"corsPolicy" field:"supported: at Envoy sidecars and gateways (grpc-go has no CORS)"`
	Headers          *headers           `json:"headers"`
}

type delegate struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

type corsPolicy struct {
	AllowOrigin         []string      `json:"allowOrigin"`
	AllowOrigins        []stringMatch `json:"allowOrigins"`
	AllowMethods        []string      `json:"allowMethods"`
	AllowHeaders        []string      `json:"allowHeaders"`
	ExposeHeaders       []string      `json:"exposeHeaders"`
	MaxAge              string        `json:"maxAge"`
	AllowCredentials    *bool         `json:"allowCredentials"`
	UnmatchedPreflights string        `json:"unmatchedPreflights"`
}

type percent struct {
	Value float64 `json:"value"`
}

type httpFault struct {
	Delay *struct {
		FixedDelay       string          `json:"fixedDelay"`
		ExponentialDelay json.RawMessage `json:"exponentialDelay"`
		Percentage       *percent        `json:"percentage"`
		Percent          int32           `json:"percent"`
	} `json:"delay"`
	Abort *struct {
		HTTPStatus int32           `json:"httpStatus"`
		GrpcStatus string          `json:"grpcStatus"`
		HTTP2Error json.RawMessage `json:"http2Error"`
		Percentage *percent        `json:"percentage"`
	} `json:"abort"`
}

type httpRewrite struct {
	URI             string          `json:"uri"`
	Authority       string          `json:"authority"`
	URIRegexRewrite json.RawMessage `json:"uriRegexRewrite"`
}

type httpRedirect struct {
	URI          string          `json:"uri"`
	Authority    string          `json:"authority"`
	Port         uint32          `json:"port"`
	DerivePort   json.RawMessage `json:"derivePort"`
	Scheme       string          `json:"scheme"`
	RedirectCode uint32          `json:"redirectCode"`
}

type headerOps struct {
	Set    map[string]string `json:"set"`
	Add    map[string]string `json:"add"`
	Remove []string          `json:"remove"`
}

type headers struct {
	Request  *headerOps `json:"request"`
	Response *headerOps `json:"response"`
}

type httpMatchRequest struct {
	Name            string                 `json:"name"`
	URI             *stringMatch           `json:"uri"`
	Scheme          *stringMatch           `json:"scheme"`
	Method          *stringMatch           `json:"method"`
	Authority       *stringMatch           `json:"authority"`
	Headers         map[string]stringMatch `json:"headers"`
	Port            uint32                 `json:"port"`
	SourceLabels    map[string]string      `json:"sourceLabels" field:"supported: by the class of the proxy (its labels); at gateways it never matches"`
	Gateways        []string               `json:"gateways"`
	QueryParams     map[string]stringMatch `json:"queryParams" field:"supported: proxyless gRPC clients skip such routes (RPCs have no query)"`
	IgnoreURICase   bool                   `json:"ignoreUriCase"`
	WithoutHeaders  map[string]stringMatch `json:"withoutHeaders"`
	SourceNamespace string                 `json:"sourceNamespace" field:"supported: at sidecars, by the class's namespace; at gateways it never matches"`
	StatPrefix      json.RawMessage        `json:"statPrefix"`
}

type stringMatch struct {
	Exact  *string `json:"exact"`
	Prefix *string `json:"prefix"`
	Regex  *string `json:"regex"`
}

type routeDestination struct {
	Destination destination `json:"destination"`
	Weight      int32       `json:"weight"`
	Headers     *headers    `json:"headers"`
}

type destination struct {
	Host   string        `json:"host"`
	Subset string        `json:"subset"`
	Port   *portSelector `json:"port"`
}

type portSelector struct {
	Number uint32 `json:"number"`
}

type httpRetry struct {
	Attempts                 int32  `json:"attempts"`
	PerTryTimeout            string `json:"perTryTimeout"`
	RetryOn                  string `json:"retryOn"`
	RetryRemoteLocalities    bool   `json:"retryRemoteLocalities"`
	RetryIgnorePreviousHosts *bool  `json:"retryIgnorePreviousHosts"`
	Backoff                  string `json:"backoff"`
}

type destinationRule struct {
	Host             string         `json:"host"`
	TrafficPolicy    *trafficPolicy `json:"trafficPolicy"`
	Subsets          []subset       `json:"subsets"`
	ExportTo         []string       `json:"exportTo"`
	WorkloadSelector *matchSelector `json:"workloadSelector" field:"rejected: not supported yet; the rule would apply to every proxy"`
}

type trafficPolicy struct {
	LoadBalancer      *loadBalancer       `json:"loadBalancer"`
	ConnectionPool    *connectionPool     `json:"connectionPool"`
	OutlierDetection  *outlierDetection   `json:"outlierDetection"`
	TLS               *clientTLS          `json:"tls"`
	PortLevelSettings []portTrafficPolicy `json:"portLevelSettings"`
	Tunnel            json.RawMessage     `json:"tunnel"`
	ProxyProtocol     json.RawMessage     `json:"proxyProtocol"`
	RetryBudget       json.RawMessage     `json:"retryBudget"`
}

type loadBalancer struct {
	Simple             string             `json:"simple"`
	ConsistentHash     *consistentHash    `json:"consistentHash"`
	LocalityLbSetting  *localityLbSetting `json:"localityLbSetting"`
	WarmupDurationSecs json.RawMessage    `json:"warmupDurationSecs"`
	Warmup             json.RawMessage    `json:"warmup"`
}

type localityLbSetting struct {
	Enabled    *bool `json:"enabled"`
	Distribute []struct {
		From string            `json:"from"`
		To   map[string]uint32 `json:"to"`
	} `json:"distribute"`
	Failover []struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"failover"`
	FailoverPriority json.RawMessage `json:"failoverPriority"`
}

type subset struct {
	Name          string            `json:"name"`
	Labels        map[string]string `json:"labels"`
	TrafficPolicy *trafficPolicy    `json:"trafficPolicy"`
}

type sidecar struct {
	WorkloadSelector      *workloadSelect   `json:"workloadSelector"`
	Ingress               []ingressListener `json:"ingress"`
	Egress                []egressListener  `json:"egress"`
	OutboundTrafficPolicy *outboundPolicy   `json:"outboundTrafficPolicy"`
	InboundConnectionPool json.RawMessage   `json:"inboundConnectionPool"`
}

type ingressListener struct {
	Port            *servicePort    `json:"port"`
	Bind            json.RawMessage `json:"bind"`
	CaptureMode     json.RawMessage `json:"captureMode"`
	DefaultEndpoint string          `json:"defaultEndpoint"`
	TLS             json.RawMessage `json:"tls"`
	ConnectionPool  json.RawMessage `json:"connectionPool"`
}

type egressListener struct {
	Port        *servicePort    `json:"port" field:"supported: the listener's hosts are what the proxy sees on that port"`
	Bind        json.RawMessage `json:"bind"`
	CaptureMode json.RawMessage `json:"captureMode"`
	Hosts       []string        `json:"hosts"`
}

type gateway struct {
	Selector map[string]string `json:"selector"`
	Servers  []gatewayServer   `json:"servers"`
}

type gatewayServer struct {
	Port            *servicePort    `json:"port"`
	Bind            json.RawMessage `json:"bind"`
	Hosts           []string        `json:"hosts"`
	TLS             *serverTLS      `json:"tls"`
	DefaultEndpoint json.RawMessage `json:"defaultEndpoint"`
	Name            string          `json:"name"`
}

type serverTLS struct {
	HTTPSRedirect         bool            `json:"httpsRedirect"`
	Mode                  string          `json:"mode" field:"supported: SIMPLE, MUTUAL, ISTIO_MUTUAL terminate HTTPS; PASSTHROUGH (TLS, HTTPS) and AUTO_PASSTHROUGH (TLS) route by SNI; the rest is warned"`
	ServerCertificate     json.RawMessage `json:"serverCertificate"`
	PrivateKey            json.RawMessage `json:"privateKey"`
	CaCertificates        json.RawMessage `json:"caCertificates"`
	CaCrl                 json.RawMessage `json:"caCrl"`
	CredentialName        string          `json:"credentialName"`
	CredentialNames       json.RawMessage `json:"credentialNames"`
	SubjectAltNames       json.RawMessage `json:"subjectAltNames"`
	VerifyCertificateSpki json.RawMessage `json:"verifyCertificateSpki"`
	VerifyCertificateHash json.RawMessage `json:"verifyCertificateHash"`
	MinProtocolVersion    json.RawMessage `json:"minProtocolVersion"`
	MaxProtocolVersion    json.RawMessage `json:"maxProtocolVersion"`
	CipherSuites          json.RawMessage `json:"cipherSuites"`
}

type consistentHash struct {
	HTTPHeaderName string `json:"httpHeaderName"`
	HTTPCookie     *struct {
		Name string          `json:"name"`
		Path json.RawMessage `json:"path"`
		TTL  string          `json:"ttl"`
	} `json:"httpCookie"`
	UseSourceIP            bool            `json:"useSourceIp"`
	HTTPQueryParameterName string          `json:"httpQueryParameterName"`
	RingHash               json.RawMessage `json:"ringHash"`
	Maglev                 json.RawMessage `json:"maglev"`
	MinimumRingSize        uint64          `json:"minimumRingSize"`
}

type connectionPool struct {
	TCP *struct {
		MaxConnections        int32           `json:"maxConnections"`
		ConnectTimeout        string          `json:"connectTimeout"`
		TCPKeepalive          json.RawMessage `json:"tcpKeepalive"`
		MaxConnectionDuration string          `json:"maxConnectionDuration"`
		IdleTimeout           string          `json:"idleTimeout"`
	} `json:"tcp"`
	HTTP *struct {
		HTTP1MaxPendingRequests  int32  `json:"http1MaxPendingRequests"`
		HTTP2MaxRequests         int32  `json:"http2MaxRequests"`
		MaxRequestsPerConnection int32  `json:"maxRequestsPerConnection"`
		MaxRetries               int32  `json:"maxRetries"`
		IdleTimeout              string `json:"idleTimeout"`
		H2UpgradePolicy          string `json:"h2UpgradePolicy"`
		UseClientProtocol        bool   `json:"useClientProtocol"`
		MaxConcurrentStreams     int32  `json:"maxConcurrentStreams"`
	} `json:"http"`
}

type outlierDetection struct {
	Consecutive5xxErrors           uint32          `json:"consecutive5xxErrors"`
	ConsecutiveGatewayErrors       uint32          `json:"consecutiveGatewayErrors"`
	ConsecutiveErrors              json.RawMessage `json:"consecutiveErrors"`
	ConsecutiveLocalOriginFailures uint32          `json:"consecutiveLocalOriginFailures"`
	SplitExternalLocalOriginErrors bool            `json:"splitExternalLocalOriginErrors"`
	Interval                       string          `json:"interval"`
	BaseEjectionTime               string          `json:"baseEjectionTime"`
	MaxEjectionPercent             int32           `json:"maxEjectionPercent"`
	MinHealthPercent               int32           `json:"minHealthPercent"`
}

type clientTLS struct {
	Mode               string          `json:"mode"`
	ClientCertificate  json.RawMessage `json:"clientCertificate"`
	PrivateKey         json.RawMessage `json:"privateKey"`
	CaCertificates     json.RawMessage `json:"caCertificates"`
	CredentialName     string          `json:"credentialName"`
	SubjectAltNames    []string        `json:"subjectAltNames"`
	Sni                string          `json:"sni"`
	InsecureSkipVerify json.RawMessage `json:"insecureSkipVerify"`
	CaCrl              json.RawMessage `json:"caCrl"`
}

// The security API (security.istio.io).

type matchSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

type authorizationPolicy struct {
	Selector   *matchSelector      `json:"selector"`
	TargetRef  json.RawMessage     `json:"targetRef"`
	TargetRefs json.RawMessage     `json:"targetRefs"`
	Action     string              `json:"action"`
	Provider   json.RawMessage     `json:"provider"`
	Rules      []authorizationRule `json:"rules"`
}

type authorizationRule struct {
	From []struct {
		Source *authorizationSource `json:"source"`
	} `json:"from"`
	To []struct {
		Operation *authorizationOperation `json:"operation"`
	} `json:"to"`
	When []authorizationCondition `json:"when"`
}

type authorizationSource struct {
	Principals           []string `json:"principals"`
	NotPrincipals        []string `json:"notPrincipals"`
	RequestPrincipals    []string `json:"requestPrincipals"`
	NotRequestPrincipals []string `json:"notRequestPrincipals"`
	Namespaces           []string `json:"namespaces"`
	NotNamespaces        []string `json:"notNamespaces"`
	IPBlocks             []string `json:"ipBlocks"`
	NotIPBlocks          []string `json:"notIpBlocks"`
	RemoteIPBlocks       []string `json:"remoteIpBlocks"`
	NotRemoteIPBlocks    []string `json:"notRemoteIpBlocks"`
	ServiceAccounts      []string `json:"serviceAccounts"`
	NotServiceAccounts   []string `json:"notServiceAccounts"`
}

type authorizationOperation struct {
	Hosts      []string `json:"hosts"`
	NotHosts   []string `json:"notHosts"`
	Ports      []string `json:"ports"`
	NotPorts   []string `json:"notPorts"`
	Methods    []string `json:"methods"`
	NotMethods []string `json:"notMethods"`
	Paths      []string `json:"paths"`
	NotPaths   []string `json:"notPaths"`
}

type authorizationCondition struct {
	Key       string   `json:"key"`
	Values    []string `json:"values"`
	NotValues []string `json:"notValues"`
}

type peerAuthentication struct {
	Selector      *matchSelector          `json:"selector"`
	Mtls          *mtlsSetting            `json:"mtls"`
	PortLevelMtls map[string]*mtlsSetting `json:"portLevelMtls"`
}

type mtlsSetting struct {
	Mode string `json:"mode"`
}

type requestAuthentication struct {
	Selector   *matchSelector  `json:"selector"`
	TargetRef  json.RawMessage `json:"targetRef"`
	TargetRefs json.RawMessage `json:"targetRefs"`
	JwtRules   []jwtRule       `json:"jwtRules"`
}

type jwtRule struct {
	Issuer                string          `json:"issuer"`
	Audiences             []string        `json:"audiences"`
	JwksURI               string          `json:"jwksUri"`
	Jwks                  string          `json:"jwks"`
	FromHeaders           []jwtHeader     `json:"fromHeaders"`
	FromParams            []string        `json:"fromParams"`
	FromCookies           json.RawMessage `json:"fromCookies"`
	OutputPayloadToHeader string          `json:"outputPayloadToHeader"`
	OutputClaimToHeaders  json.RawMessage `json:"outputClaimToHeaders"`
	ForwardOriginalToken  bool            `json:"forwardOriginalToken"`
	Timeout               json.RawMessage `json:"timeout"`
}

type jwtHeader struct {
	Name   string `json:"name"`
	Prefix string `json:"prefix"`
}

type outboundPolicy struct {
	Mode        string          `json:"mode"`
	EgressProxy json.RawMessage `json:"egressProxy"`
}

type portTrafficPolicy struct {
	Port             *portSelector     `json:"port"`
	LoadBalancer     *loadBalancer     `json:"loadBalancer"`
	ConnectionPool   *connectionPool   `json:"connectionPool"`
	OutlierDetection *outlierDetection `json:"outlierDetection"`
	TLS              *clientTLS        `json:"tls"`
}

type directResponse struct {
	Status uint32 `json:"status"`
	Body   *struct {
		String *string `json:"string"`
		Bytes  []byte  `json:"bytes"`
	} `json:"body"`
}
