package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestAttack is the hostile-input matrix (issue 11, item 5): one running
// `meshca serve`, the real kube-apiserver, and every attack a caller can
// make with its headers, its token, its client certificate, its metadata,
// its CSR and its TTL. Each refused attack must get the gRPC code the
// README's error table names, with a message a client can act on, and
// must leave no trace of an issuance: the issuance counter and the signer
// backend's call count unchanged, no "issued" audit event, and, when the
// request reached meshca's handler, exactly one "denied" audit event with
// that code. No token the test held may appear in meshca's log.
//
// The few requests the wire contract says to accept although they look
// hostile (a TTL <= 0, unknown metadata keys) run as "accepted" rows,
// which must issue exactly the caller's identity for the default TTL.
//
// Issue 22 extends the matrix to every surface meshca serves besides
// CreateCertificate, against the same apiserver: the remote-cluster
// Secrets, PodCertificateRequests, the trust publishers, the SPIFFE
// bundle endpoint and the admin port of the arena's meshca; and, each
// with a meshca of its own, the budgets and limits (a forged-token flood
// beside good clients, requests at once, connection floods, HTTP/2
// abuse) and the record on the trust publishers' Lease. Every row names
// the defence it exercises (a CreateCertificate row, its audit reason);
// the matrix reports how many distinct defences held, and asks for at
// least minDefences. Issue 28 adds istiod's certificate Secret (another
// owner's, a CA's, named by a typo) and istiod's restart (the chart's
// admission policy), each with a meshca or a rendering of its own.
func TestAttack(t *testing.T) {
	start := time.Now()
	// The surfaces besides CreateCertificate that the arena's meshca
	// serves: their flags first, their objects once it runs.
	rs, pc, tr := newRemoteSecretSurface(t), newPodCertSurface(t), newTrustSurface(t)
	a := newArena(t, slices.Concat(rs.flags, pc.flags, tr.flags, bundleEndpointFlags)...)
	rs.prepare(t, a)
	pc.prepare(t, a)
	slow := a.slowClients(t) // they take seconds: started now, judged later
	var refused []attack
	for _, rows := range [][]attack{
		a.tokenAttacks(t), a.impersonationAttacks(t), a.metadataAttacks(t),
		a.csrAttacks(t), a.ttlAttacks(t), a.mtlsAttacks(t), a.fixedBugs(t),
	} {
		refused = append(refused, rows...)
	}
	accepted := a.accepted(t)
	harness.Report(t, "set up in %v: %d refused attacks, %d accepted requests",
		time.Since(start).Round(time.Millisecond), len(refused)+1, len(accepted))
	m := &matrix{defences: map[string]int{}}
	for _, tt := range refused {
		m.attack(t, a, tt)
	}
	for _, tt := range accepted {
		t.Run(tt.name, func(t *testing.T) { a.accept(t, tt) })
	}
	for _, checks := range [][]check{rs.checks(t, a), pc.checks(t, a), tr.checks(t, a), slow.checks(t, a), a.httpChecks(t)} {
		m.checks(t, checks)
	}
	// Each of these runs a meshca of its own, with the flags it attacks.
	budget := newBudgetArena(t)
	m.attacks(t, budget, budget.budgetRateAttacks(t))
	m.checks(t, budget.budgetChecks(t))
	m.checks(t, budget.connChecks(t))
	m.checks(t, budget.adminConnChecks(t))
	budget.checkNoSecretsLogged(t)
	own := newOwnDenyArena(t)
	m.attacks(t, own, own.ownIdentityAttacks(t))
	own.checkNoSecretsLogged(t)
	m.checks(t, concurrencyChecks(t))
	m.checks(t, leaseChecks(t))
	m.checks(t, istiodChecks(t))
	// Last: it retires the root that signed the workload's certificate.
	m.attack(t, a, a.retiredRootAttack(t))
	a.checkNoSecretsLogged(t)
	m.report(t, time.Since(start))
}

// attack is one row of the matrix.
type attack struct {
	name string
	// before, when set, prepares the attack before the counters are read.
	before func(t *testing.T)
	// do makes the attack; ctx carries the row's x-request-id.
	do   func(ctx context.Context) (*authpb.IstioCertificateResponse, error)
	code codes.Code
	// msg is a fragment of the status message the client receives.
	msg string
	// reason is the audit event's reason; alternatives are separated by
	// "|". With transport set no audit event is expected at all.
	reason string
	// transport: refused before meshca's handler (TLS handshake, HTTP/2
	// or gRPC message limits), so the request is not even counted.
	transport bool
	// defence names the defence when neither the audit reason nor the
	// transport's refusal does.
	defence string
}

// arena is the server and the cluster objects the attacks use.
type arena struct {
	*mesh
	web   *harness.Workload // apps/web on node-a: the victim and the honest caller
	webID spiffeid.ID
	// roots verify meshca's serving certificate; the retired-root attack
	// replaces them.
	roots *x509.CertPool
	// webCert is the web workload's SVID, signed by the first root.
	webCert *tls.Certificate
	// bigRSA delivers the RSA-16384 and RSA-40960 keys, made while the
	// rest is set up; rsa16kBadSig is a CSR of the first with a broken
	// signature.
	bigRSA       chan [2]*multiPrimeRSA
	rsa16kBadSig string
	// secrets are every token the test held: none may reach the log.
	// Checks that attack at once remember theirs from many goroutines.
	secretsMu sync.Mutex
	secrets   []string
	seq       int
}

func newArena(t *testing.T, flags ...string) *arena {
	t.Helper()
	m := newMesh(t, flags...)
	a := &arena{mesh: m, roots: m.s.roots, bigRSA: bigRSAKeys()}
	a.web = cluster.NewWorkload(t, m.apps, "web", "node-a")
	a.webID = m.id("web")
	a.secret(a.web.Token, m.ztunnelA.Token, m.ztunnelB.Token)
	return a
}

// secret remembers tokens for the final log check.
func (a *arena) secret(tokens ...string) {
	a.secretsMu.Lock()
	defer a.secretsMu.Unlock()
	a.secrets = append(a.secrets, tokens...)
}

// run makes one attack and checks that it was refused as expected and
// that nothing was issued or signed; it returns the audit reason.
func (a *arena) run(t *testing.T, tt attack) (reason string) {
	if tt.before != nil {
		tt.before(t)
	}
	a.seq++
	rid := fmt.Sprintf("attack-%03d", a.seq)
	before, issued := a.counters(t), a.issuedEvents(t)
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-request-id", rid), 30*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := tt.do(ctx)
	took := time.Since(start)
	st := status.Convert(err)
	t.Logf("%s: %v %q in %v", rid, st.Code(), st.Message(), took.Round(time.Millisecond))
	if st.Code() != tt.code || !strings.Contains(st.Message(), tt.msg) {
		t.Errorf("got %v %q, want %v containing %q", st.Code(), st.Message(), tt.code, tt.msg)
	}
	if resp != nil && len(resp.GetCertChain()) > 0 {
		t.Errorf("a certificate chain came back: %d elements", len(resp.GetCertChain()))
	}
	after := a.counters(t)
	if d := after.issued - before.issued; d != 0 {
		t.Errorf("citadel_server_success_cert_issuance_count grew by %v", d)
	}
	if d := after.signed - before.signed; d != 0 {
		t.Errorf("the signer backend was called %v times", d)
	}
	switch d := after.requests - before.requests; {
	case tt.transport && d != 0:
		t.Errorf("expected a refusal before the handler, but citadel_server_csr_count grew by %v", d)
	case !tt.transport && d != 1:
		t.Errorf("citadel_server_csr_count grew by %v, want 1", d)
	case !tt.transport:
		reason = a.checkDenied(t, rid, tt)
	}
	if n := a.issuedEvents(t); n != issued {
		t.Errorf("%d new issued audit events", n-issued)
	}
	return reason
}

// checkDenied waits for the audit event of request rid, checks it, and
// returns its reason.
func (a *arena) checkDenied(t *testing.T, rid string, tt attack) string {
	t.Helper()
	ev := a.auditEvent(t, rid)
	if ev == nil {
		t.Errorf("no audit event for %s", rid)
		return ""
	}
	if ns, ok := ev["latency"].(float64); ok {
		t.Logf("%s: meshca decided in %v", rid, time.Duration(ns).Round(time.Microsecond))
	}
	if ev["decision"] != "denied" || ev["code"] != tt.code.String() {
		t.Errorf("audit event %v, want decision denied, code %v", ev, tt.code)
	}
	r, _ := ev["reason"].(string)
	if tt.reason != "" && !oneOf(r, tt.reason) {
		t.Errorf("audit reason %q, want %s", r, tt.reason)
	}
	return r
}

func oneOf(s, alternatives string) bool {
	for _, alt := range strings.Split(alternatives, "|") {
		if s == alt {
			return true
		}
	}
	return false
}

// acceptance is a request that looks hostile but that the wire contract
// says to serve: it must issue exactly the caller's identity.
type acceptance struct {
	name  string
	token string
	cert  *tls.Certificate
	ttl   int64
	meta  *structpb.Struct
	// lifetime is the leaf's expected NotAfter - now.
	lifetime time.Duration
}

func (a *arena) accept(t *testing.T, tt acceptance) {
	a.seq++
	rid := fmt.Sprintf("attack-%03d", a.seq)
	before := a.counters(t)
	key, csrPEM := newKeyAndCSR(t, a.webID)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-request-id", rid)
	resp, err := a.send(ctx, probe{token: tt.token, cert: tt.cert,
		req: &authpb.IstioCertificateRequest{Csr: csrPEM, ValidityDuration: tt.ttl, Metadata: tt.meta}})
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	svid, err := checked.Check(t, resp.GetCertChain(), a.webID, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf := svid.Chain[0]
	if left := time.Until(leaf.NotAfter); left > tt.lifetime+time.Minute || left < tt.lifetime-time.Minute {
		t.Errorf("leaf lives %v more, want about %v", left.Round(time.Second), tt.lifetime)
	}
	if len(leaf.URIs) != 1 || len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 || leaf.IsCA {
		t.Errorf("leaf has URIs %v DNS %v IP %v email %v CA %v", leaf.URIs, leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses, leaf.IsCA)
	}
	after := a.counters(t)
	if after.issued-before.issued != 1 || after.requests-before.requests != 1 {
		t.Errorf("issuance count grew by %v and request count by %v, want 1 and 1", after.issued-before.issued, after.requests-before.requests)
	}
	if ev := a.auditEvent(t, rid); ev == nil || ev["decision"] != "issued" || ev["identity"] != a.webID.String() {
		t.Errorf("audit event %v, want issued for %s", ev, a.webID)
	}
}

// probe is one CreateCertificate over a connection of its own.
type probe struct {
	// token is sent as "authorization: Bearer <token>" when not empty.
	token string
	// md are more headers as key, value pairs; a key may repeat.
	md []string
	// noClusterID leaves out the clusterid header.
	noClusterID bool
	// cert is presented whatever CAs the server says it accepts (Go's
	// client would otherwise leave out a certificate of a foreign CA).
	cert *tls.Certificate
	// tls12 caps the handshake at TLS 1.2, where a refused client
	// certificate fails the client's own handshake with the server's
	// alert; in TLS 1.3 the alert races the client's first write.
	tls12 bool
	req   *authpb.IstioCertificateRequest
	// raw, when set, is sent as the request message instead of req.
	raw []byte
	// from is the loopback address the connection comes from (an
	// address of 127.0.0.0/8), so that a row has a peer of its own.
	from string
	// conn, when set, carries the request instead of a connection of
	// its own (cert, tls12 and from are then conn's business).
	conn *grpc.ClientConn
}

func (a *arena) send(ctx context.Context, p probe) (*authpb.IstioCertificateResponse, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: a.roots, ServerName: "istiod.istio-system.svc"}
	if p.cert != nil {
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return p.cert, nil }
	}
	if p.tls12 {
		tc.MaxVersion = tls.VersionTLS12
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
	if p.from != "" {
		opts = append(opts, grpc.WithContextDialer(dialFrom(p.from)))
	}
	conn := p.conn
	if conn == nil {
		var err error
		if conn, err = grpc.NewClient(a.s.Addr, opts...); err != nil {
			return nil, err
		}
		defer conn.Close()
	}
	var kv []string
	if p.token != "" {
		kv = append(kv, authpb.HeaderAuthorization, authpb.BearerPrefix+p.token)
	}
	if !p.noClusterID {
		kv = append(kv, authpb.HeaderClusterID, authpb.DefaultClusterID)
	}
	kv = append(kv, p.md...)
	ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	if p.raw != nil {
		resp := &authpb.IstioCertificateResponse{}
		err := conn.Invoke(ctx, authpb.IstioCertificateService_CreateCertificate_FullMethodName, p.raw, resp, grpc.ForceCodec(rawCodec{}))
		return resp, err
	}
	return authpb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, p.req)
}

// dialFrom dials from the loopback address ip.
func dialFrom(ip string) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return d.DialContext(ctx, "tcp", addr)
	}
}

// rawCodec sends a request message as the bytes given, so that a test can
// put on the wire what the generated code refuses to marshal.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }

func (rawCodec) Name() string { return "proto" }

// do returns an attack's do for p.
func (a *arena) do(p probe) func(context.Context) (*authpb.IstioCertificateResponse, error) {
	return func(ctx context.Context) (*authpb.IstioCertificateResponse, error) { return a.send(ctx, p) }
}

// asWeb sends csrPEM with the web workload's token for its own identity.
func (a *arena) asWeb(csrPEM string) func(context.Context) (*authpb.IstioCertificateResponse, error) {
	return a.do(probe{token: a.web.Token, req: &authpb.IstioCertificateRequest{Csr: csrPEM, ValidityDuration: 86400}})
}

// impersonating asks, with token, for the identity id in the metadata
// struct, with a CSR for id (for the web workload when id is malformed,
// so that only the identity is wrong).
func (a *arena) impersonating(t *testing.T, token, id string) func(context.Context) (*authpb.IstioCertificateResponse, error) {
	csrID, err := spiffeid.FromString(id)
	if err != nil {
		csrID = a.webID
	}
	return a.do(probe{token: token, req: &authpb.IstioCertificateRequest{Csr: newCSR(t, csrID), ValidityDuration: 86400,
		Metadata: meta(authpb.MetaImpersonatedIdentity, structpb.NewStringValue(id))}})
}

func meta(kv ...any) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := 0; i < len(kv); i += 2 {
		s.Fields[kv[i].(string)] = kv[i+1].(*structpb.Value)
	}
	return s
}

// counters are meshca's own counts, read from its admin /metrics.
type counters struct {
	issued, requests, signed float64
}

var (
	issuedMetric   = regexp.MustCompile(`(?m)^citadel_server_success_cert_issuance_count(?:\{[^}]*\})? (\S+)$`)
	requestsMetric = regexp.MustCompile(`(?m)^citadel_server_csr_count(?:\{[^}]*\})? (\S+)$`)
	signedMetric   = regexp.MustCompile(`(?m)^meshca_sign_duration_seconds_count(?:\{[^}]*\})? (\S+)$`)
)

func (a *arena) counters(t *testing.T) counters {
	t.Helper()
	body := adminMetrics(t, a.s.AdminAddr)
	sum := func(re *regexp.Regexp, required bool) float64 {
		ms := re.FindAllStringSubmatch(body, -1)
		if len(ms) == 0 && required {
			t.Fatalf("/metrics lacks %s", re)
		}
		n := 0.0
		for _, m := range ms {
			v, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			n += v
		}
		return n
	}
	return counters{issued: sum(issuedMetric, true), requests: sum(requestsMetric, true), signed: sum(signedMetric, false)}
}

// auditEvents returns meshca's audit events of certificate requests.
func (a *arena) auditEvents() []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(a.s.Logs(), "\n") {
		if !strings.Contains(line, `"audit":true`) {
			continue
		}
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) == nil && ev["event"] == "certificate" {
			out = append(out, ev)
		}
	}
	return out
}

// issuedEvents counts the audit events that say a certificate was issued.
func (a *arena) issuedEvents(t *testing.T) int {
	t.Helper()
	n := 0
	for _, ev := range a.auditEvents() {
		if ev["decision"] == "issued" || ev["code"] == "OK" {
			n++
		}
	}
	return n
}

// auditEvent waits for the audit event of request rid.
func (a *arena) auditEvent(t *testing.T, rid string) map[string]any {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, ev := range a.auditEvents() {
			if ev["request_id"] == rid {
				return ev
			}
		}
	}
	return nil
}

// checkNoSecretsLogged: no token, nor the signature of one, nor a key
// or a CSR appears in the log.
func (a *arena) checkNoSecretsLogged(t *testing.T) {
	logs := a.s.Logs()
	a.secretsMu.Lock()
	defer a.secretsMu.Unlock()
	for _, tok := range a.secrets {
		parts := strings.Split(tok, ".")
		needles := []string{tok}
		if sig := parts[len(parts)-1]; len(parts) == 3 && len(sig) >= 16 {
			needles = append(needles, sig)
		}
		for _, n := range needles {
			if len(n) >= 16 && strings.Contains(logs, n) {
				t.Errorf("a token (%d bytes, starting %.12q) appears in meshca's log", len(tok), tok)
			}
		}
	}
	for _, s := range []string{"PRIVATE KEY", "BEGIN CERTIFICATE REQUEST"} {
		if strings.Contains(logs, s) {
			t.Errorf("meshca's log holds %q", s)
		}
	}
}
