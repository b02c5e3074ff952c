// Package ca serves the Istio CA gRPC API: it authenticates the caller,
// decides the one identity the request may receive, checks the CSR, has a
// signer backend sign it, verifies the result and answers in the layout
// Istio's clients expect.
package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/csr"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
)

// Defaults of Config.
const (
	DefaultTTL       = 24 * time.Hour
	DefaultMaxTTL    = 90 * 24 * time.Hour
	DefaultClusterID = authpb.DefaultClusterID
	// DefaultTrustDomain is Istio's default trust domain.
	DefaultTrustDomain = "cluster.local"
	// DefaultNodeAccount is ztunnel's namespace/service account in a
	// default Istio ambient install.
	DefaultNodeAccount    = "istio-system/ztunnel"
	DefaultMaxInFlight    = 1024
	DefaultRequestTimeout = 30 * time.Second
	// DefaultMaxAuthnPerPeer bounds the authentications one peer address
	// may have in progress; more wait for their turn, at most
	// a bounded number of them over all peers (limit.Config).
	DefaultMaxAuthnPerPeer = 64
	// DefaultMaxTokenBytes bounds a bearer token: a bound service-account
	// token is 1-2 KiB, so anything past this is refused before it leaves
	// the process.
	DefaultMaxTokenBytes = 8 << 10
	// DefaultMaxHeaderBytes bounds the header list of one request (the
	// HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE the server advertises and
	// enforces).
	DefaultMaxHeaderBytes = 64 << 10
)

// Config assembles a Server. Zero durations and limits take the defaults
// above; Logger and Now default to slog.Default and time.Now.
type Config struct {
	TrustDomain spiffeid.TrustDomain
	// Authenticators that do not depend on the cluster (client
	// certificates); tried before the cluster's own.
	Authenticators []Authenticator
	// Clusters maps the clusterid header to the cluster that reviews the
	// token and authorizes the request; "" selects the local cluster.
	Clusters ClusterSource
	// Signer is the backend; its latency and errors go to Metrics
	// (signer.Observe), whichever backend it is.
	Signer signer.Signer
	// SignerName labels metrics and audit events ("local", "vault", ...).
	SignerName string
	// Bundles is the trust bundle: every issued chain must verify to it,
	// and it is the last element of every response.
	Bundles    x509bundle.Source
	Policy     csr.Policy
	DefaultTTL time.Duration
	MaxTTL     time.Duration
	// MaxInFlight bounds the authenticated requests served at once.
	MaxInFlight int
	// MaxAuthnPerPeer bounds the authentications one peer address (IP) may
	// have in progress; they run before an issuance slot is taken, so
	// unauthenticated callers cannot fill the slots.
	MaxAuthnPerPeer int
	// Limits are the budgets of each caller and each peer address.
	Limits limit.Limits
	// Conn bounds the connections of the gRPC server (NewGRPCServer).
	Conn limit.ConnLimits
	// RequestTimeout is the longest any request runs, whatever deadline
	// its client sends.
	RequestTimeout time.Duration
	// MaxTokenBytes bounds a bearer token; longer ones are refused
	// without a TokenReview.
	MaxTokenBytes int
	// MaxHeaderBytes bounds a request's header list at the transport.
	MaxHeaderBytes int
	// CertSigners are the CertSigner names the one backend answers for;
	// a request naming another is refused (certsigner.go).
	CertSigners []string
	// CertRenewalTTL caps the lifetime of a certificate issued to a caller
	// authenticated by its client certificate: a renewal never gets more
	// than this (DefaultTTL when zero), nor more than the certificate it
	// presents (Server.ttl).
	CertRenewalTTL time.Duration
	Metrics        *Metrics
	Logger         *slog.Logger
	// Audit receives one event per request; nil writes them through
	// Logger (AuditLogger).
	Audit AuditSink
	Now   func() time.Time
	// Sleep waits d on Now's clock, or until ctx ends: a request whose
	// address has spent its authentication failures waits for its review
	// turn (Limits). A timer when nil.
	Sleep func(ctx context.Context, d time.Duration) error
	// NodeBlocks are the nodes blocked by a revocation, whose proxies get
	// no certificate; nil blocks none.
	NodeBlocks NodeBlocks
}

// Server implements IstioCertificateService.
type Server struct {
	authpb.UnimplementedIstioCertificateServiceServer
	c Config
	// limits are the budgets, the authentication turns and the issuance
	// slots.
	limits *limit.Limiter
	// decode is the gRPC server's codec (NewGRPCServer), which keeps the
	// errors of requests that did not decode; nil without one.
	decode *requestCodec
	issued issuedChains
}

// New returns a Server. It starts nothing.
func New(c Config) (*Server, error) {
	switch {
	case c.TrustDomain.IsZero():
		return nil, errors.New("ca: trust domain is required")
	case c.Signer == nil:
		return nil, errors.New("ca: signer is required")
	case c.Bundles == nil:
		return nil, errors.New("ca: trust bundle source is required")
	case c.Clusters == nil:
		return nil, errors.New("ca: clusters are required")
	case c.Metrics == nil:
		return nil, errors.New("ca: metrics are required")
	}
	if c.DefaultTTL <= 0 {
		c.DefaultTTL = DefaultTTL
	}
	if c.MaxTTL <= 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.DefaultTTL > c.MaxTTL {
		return nil, fmt.Errorf("ca: default TTL %v is above the maximum %v", c.DefaultTTL, c.MaxTTL)
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxAuthnPerPeer <= 0 {
		c.MaxAuthnPerPeer = DefaultMaxAuthnPerPeer
	}
	if c.MaxTokenBytes <= 0 {
		c.MaxTokenBytes = DefaultMaxTokenBytes
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.CertRenewalTTL <= 0 || c.CertRenewalTTL > c.DefaultTTL {
		c.CertRenewalTTL = c.DefaultTTL
	}
	if k := c.Policy.Keys; len(k.ECDSACurves) == 0 && !k.Ed25519 && k.RSAMinBits == 0 {
		c.Policy = csr.DefaultPolicy()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Audit == nil {
		c.Audit = AuditLogger(c.Logger)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.SignerName == "" {
		c.SignerName = "unnamed"
	}
	c.Conn = c.Conn.WithDefaults(c.RequestTimeout)
	c.Metrics.initBackend(c.SignerName)
	c.Signer = signer.Observe(c.Signer, c.SignerName, c.Metrics)
	limits := limit.New(limit.Config{Limits: c.Limits, MaxInFlight: c.MaxInFlight,
		MaxAuthnPerPeer: c.MaxAuthnPerPeer, Now: c.Now, Sleep: c.Sleep})
	return &Server{c: c, limits: limits}, nil
}

// request is one CreateCertificate call as it moves through the steps.
type request struct {
	id        string
	creds     Credentials
	peer      string
	caller    *Caller
	requested string
	identity  spiffeid.ID
	// proxyNode is the node of the node proxy the identity is issued
	// through, if any (Decision.ProxyNode).
	proxyNode string
	leaf      *x509.Certificate
	// issuer is the ID of the CA certificate that signed leaf, when known.
	issuer string
}

// CreateCertificate implements IstioCertificateService.
func (s *Server) CreateCertificate(ctx context.Context, in *authpb.IstioCertificateRequest) (*authpb.IstioCertificateResponse, error) {
	start := s.c.Now()
	s.c.Metrics.csrCount.Inc()
	// Every request ends by RequestTimeout, whatever its client asked:
	// WithTimeout keeps the earlier of the two deadlines.
	ctx, cancel := context.WithTimeout(ctx, s.c.RequestTimeout)
	defer cancel()
	r := &request{id: requestID(ctx)}
	resp, err := s.serve(ctx, in, r)
	return resp, s.finish(ctx, r, err, start)
}

// serve runs the steps of one request. Authentication runs under its own
// per-peer budget before an issuance slot is taken, so callers that cannot
// authenticate never hold one.
func (s *Server) serve(ctx context.Context, in *authpb.IstioCertificateRequest, r *request) (*authpb.IstioCertificateResponse, error) {
	var err error
	if err := s.decode.takeError(in); err != nil {
		return nil, refuse(codes.InvalidArgument, "request_malformed",
			"the request message does not decode as an IstioCertificateRequest: "+err.Error(), nil)
	}
	if r.creds, r.peer, err = credentialsFrom(ctx, s.c.MaxTokenBytes); err != nil {
		return nil, err
	}
	cluster, ok := s.c.Clusters.Cluster(r.creds.ClusterID)
	if !ok {
		return nil, refuse(codes.Unauthenticated, "unknown_cluster",
			fmt.Sprintf("unknown cluster %q: this CA does not serve it", r.creds.ClusterID), nil)
	}
	if r.caller, err = s.authenticate(ctx, cluster, r); err != nil {
		return nil, err
	}
	limit.ConnAuthenticated(ctx) // ConnGuard: no longer idle unauthenticated
	release, err := s.limits.Admit(budgetOf(cluster, r.caller))
	if err != nil {
		return nil, err
	}
	defer release()
	releaseSlot, err := s.limits.TakeSlot()
	if err != nil {
		return nil, err
	}
	defer releaseSlot()
	s.c.Metrics.inFlight.Inc()
	defer s.c.Metrics.inFlight.Dec()
	if r.requested, err = requestedIdentity(in); err != nil {
		return nil, err
	}
	if err := checkCertSigner(in, s.c.CertSigners); err != nil {
		return nil, err
	}
	d, err := cluster.Authorizer.Decide(ctx, r.caller, r.requested)
	if err != nil {
		return nil, err
	}
	r.identity, r.proxyNode = d.ID, d.ProxyNode
	if err := s.checkNodeBlock(d, r.caller); err != nil {
		return nil, err
	}
	req, err := csr.ParseFor([]byte(in.GetCsr()), &s.c.Policy.Keys)
	if err != nil {
		return nil, err
	}
	if err := s.c.Policy.Check(req, r.identity); err != nil {
		return nil, policyRefusal(req, err)
	}
	ttl, err := s.ttl(in.GetValidityDuration(), r.caller)
	if err != nil {
		return nil, err
	}
	sreq := &signer.Request{CSR: req, ID: r.identity, TTL: ttl, Usages: csr.WorkloadUsages(req.PublicKey)}
	if r.caller.Method == MethodCertificate {
		// Backdate included, as the presented certificate's is counted.
		sreq.Lifetime = ttl
	}
	res, err := s.c.Signer.Sign(ctx, sreq)
	if err != nil {
		return nil, err
	}
	r.leaf = res.Leaf
	return s.respond(r, res)
}

// budgetOf is c, authenticated for cluster, as its budget sees it: a
// caller whose service account is a trusted node account of cluster is a
// node proxy, whose Pod has a budget of its own.
func budgetOf(cluster *Cluster, c *Caller) limit.Caller {
	b := limit.Caller{ID: c.ID.String()}
	if cluster.Authorizer != nil && cluster.Authorizer.TrustedNodeAccounts[c.Namespace+"/"+c.ServiceAccount] {
		b.NodeProxy = true
		if c.PodName != "" {
			b.Pod = cluster.ID + "/" + c.Namespace + "/" + c.PodName
		}
	}
	return b
}

// requestedIdentity returns the ImpersonatedIdentity metadata field, or ""
// when the caller asks for its own identity.
func requestedIdentity(in *authpb.IstioCertificateRequest) (string, error) {
	v, ok := in.GetMetadata().GetFields()[metaImpersonate]
	if !ok {
		return "", nil
	}
	if _, isString := v.GetKind().(*structpb.Value_StringValue); !isString {
		return "", refuse(codes.InvalidArgument, "malformed_identity", metaImpersonate+" must be one SPIFFE ID string", nil)
	}
	return v.GetStringValue(), nil
}

// ttl applies the TTL rules: the default when the client asks for none, a
// refusal above the maximum (as Istio does). A renewal by client
// certificate gets at most CertRenewalTTL and at most the validity of the
// certificate it presents (Caller.CertLifetime), so that a certificate
// cannot stretch itself by renewing itself: a 1 h SVID renews into 1 h
// ones. Its validity is then counted as the presented one's, NotAfter
// less NotBefore, backdate included (signer.Request.Lifetime), or each
// renewal would add a backdate.
func (s *Server) ttl(seconds int64, c *Caller) (time.Duration, error) {
	if seconds > int64(s.c.MaxTTL/time.Second) {
		return 0, refuse(codes.InvalidArgument, reasonTTL,
			fmt.Sprintf("requested TTL %ds is above the maximum %ds", seconds, int64(s.c.MaxTTL/time.Second)), nil)
	}
	ttl := s.c.DefaultTTL
	if seconds > 0 {
		ttl = time.Duration(seconds) * time.Second
	}
	if c.Method == MethodCertificate {
		ttl = min(ttl, s.c.CertRenewalTTL)
		if c.CertLifetime > 0 {
			ttl = min(ttl, c.CertLifetime)
		}
	}
	return ttl, nil
}

const reasonTTL = "ttl_too_long"

// respond verifies the issued chain against the current trust bundle and
// lays it out as Istio's clients expect: leaf, intermediates, then every
// trusted root in one PEM string (issuedChains keeps what it can per
// bundle).
func (s *Server) respond(r *request, res *signer.Response) (*authpb.IstioCertificateResponse, error) {
	id := r.identity
	bundle, err := s.c.Bundles.GetX509BundleForTrustDomain(s.c.TrustDomain)
	if err != nil {
		return nil, refuse(codes.Unavailable, "no_trust_bundle", "CA has no trust bundle yet, retry later", err)
	}
	got, out, err := s.issued.verify(s.issued.forBundle(bundle), res, s.c.Now())
	if err != nil {
		return nil, refuse(codes.Internal, "issued_chain_invalid", "issued certificate failed verification", err)
	}
	if got != id {
		return nil, refuse(codes.Internal, "issued_wrong_identity", "issued certificate failed verification", fmt.Errorf("issued %s, authorized %s", got, id))
	}
	r.issuer = leafIssuer(res, bundle.X509Authorities())
	return &authpb.IstioCertificateResponse{CertChain: out}, nil
}
