package authpb

// Words of the Istio CA protocol that the generated code does not name:
// the request headers and metadata fields that ztunnel and istio-agent
// send, and Istio's defaults for them. Written once, here, for the server
// (package ca) and the client (package ca/caclient) alike.
const (
	// HeaderAuthorization carries "Bearer <service-account token>".
	HeaderAuthorization = "authorization"
	// BearerPrefix starts the authorization header's value.
	BearerPrefix = "Bearer "
	// HeaderClusterID names the cluster whose apiserver reviews the token.
	HeaderClusterID = "clusterid"
	// MetaImpersonatedIdentity is the IstioCertificateRequest metadata
	// field in which a node proxy names the workload identity it asks for.
	MetaImpersonatedIdentity = "ImpersonatedIdentity"
	// DefaultAudience is the audience Istio's clients request for their
	// tokens.
	DefaultAudience = "istio-ca"
	// DefaultClusterID is Istio's name of the local cluster.
	DefaultClusterID = "Kubernetes"
)
