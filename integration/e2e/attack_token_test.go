package e2e

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// tokenMsg is what meshca says on the wire for every refused token; the
// reason goes to the audit log.
const tokenMsg = "token is not a valid service-account token for this CA"

// tokenAttacks: credentials that must not authenticate. Every one that
// reaches meshca is Unauthenticated (README: "who are you?"), which
// istio-agent does not retry; a header past the transport's limit never
// reaches it.
func (a *arena) tokenAttacks(t *testing.T) []attack {
	ns, past := a.apps, time.Now().Add(-2*time.Hour)
	gone := cluster.NewWorkload(t, ns, "gone", "node-a")
	cluster.DeletePod(t, ns, gone.Pod)
	phoenix := cluster.NewWorkload(t, ns, "phoenix", "node-a")
	cluster.DeletePod(t, ns, phoenix.Pod)
	cluster.Pod(t, ns, phoenix.Pod, "phoenix", "node-a") // same name, new UID
	evilKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	claims := boundClaims(a, ns, "web", a.web.Pod)
	tok := map[string]string{
		"audience": cluster.Token(t, ns, "web", a.web.Pod, []string{"some-other-service"}, time.Hour),
		"expired":  cluster.SignedToken(t, ns, "web", []string{"istio-ca"}, past, past.Add(time.Hour)),
		"legacy":   a.legacyToken(t, ns, "web"),
		"gone":     gone.Token,
		"phoenix":  phoenix.Token,
		"issuer":   signJWT(t, evilKey, "RS256", withClaim(claims, "iss", "https://evil.example")),
		"key":      signJWT(t, evilKey, "RS256", claims),
		"none":     signJWT(t, nil, "none", claims),
		"cut":      a.web.Token[:len(a.web.Token)-8],
		"twoparts": a.web.Token[:strings.LastIndex(a.web.Token, ".")],
		"32k":      "eyJ" + strings.Repeat("A", 32<<10),
	}
	for _, v := range tok {
		a.secret(v)
	}
	csrPEM := newCSR(t, a.webID)
	req := &authpb.IstioCertificateRequest{Csr: csrPEM, ValidityDuration: 86400}
	with := func(token string, md ...string) func(context.Context) (*authpb.IstioCertificateResponse, error) {
		return a.do(probe{token: token, md: md, req: req})
	}
	bad := func(token string) func(context.Context) (*authpb.IstioCertificateResponse, error) {
		return a.do(probe{md: []string{authpb.HeaderAuthorization, token}, req: req})
	}
	const U = codes.Unauthenticated
	return []attack{
		{name: "token/wrong audience", do: with(tok["audience"]), code: U, msg: tokenMsg, reason: "audience_mismatch"},
		{name: "token/expired", do: with(tok["expired"]), code: U, msg: tokenMsg, reason: "token_expired"},
		// The apiserver here runs no token controller, so the legacy
		// Secret token is made as that controller makes it (signed with
		// the apiserver's key, stored in a service-account-token Secret).
		// TokenReview does not vouch for it for audience istio-ca.
		{name: "token/legacy unbound Secret token", do: with(tok["legacy"]), code: U, msg: tokenMsg,
			reason: "audience_mismatch"},
		// Its audit reason is pinned in fixedBugs.
		{name: "token/deleted Pod", do: with(tok["gone"]), code: U, msg: tokenMsg,
			reason: "token_bound_object_gone|caller_pod_missing|token_invalid"},
		{name: "token/Pod replaced under the same name", do: with(tok["phoenix"]), code: U, msg: tokenMsg,
			reason: "token_bound_object_gone|caller_uid_mismatch"},
		{name: "token/signed by another issuer", do: with(tok["issuer"]), code: U, msg: tokenMsg, reason: "token_invalid"},
		{name: "token/apiserver's issuer, another key", do: with(tok["key"]), code: U, msg: tokenMsg, reason: "token_invalid"},
		{name: "token/alg none", do: with(tok["none"]), code: U, msg: tokenMsg, reason: "token_invalid"},
		{name: "token/truncated signature", do: with(tok["cut"]), code: U, msg: tokenMsg, reason: "token_invalid"},
		{name: "token/truncated to two segments", do: with(tok["twoparts"]), code: U, msg: tokenMsg, reason: "token_malformed"},
		{name: "token/32 KiB, past --max-token-bytes", do: with(tok["32k"]), code: U, msg: "longer than the 8192 this CA accepts",
			reason: "token_too_large"},
		a.hugeHeaderAttack(t),
		{name: "token/two authorization headers", do: with(a.web.Token, authpb.HeaderAuthorization, authpb.BearerPrefix+a.ztunnelA.Token),
			code: U, msg: "send exactly one authorization header", reason: "bad_authorization_header"},
		{name: "token/Basic scheme", do: bad("Basic " + base64.StdEncoding.EncodeToString([]byte("admin:admin"))), code: U,
			msg: "authorization header must be 'Bearer <token>'", reason: "bad_authorization_header"},
		{name: "token/Bearer without a token", do: bad("Bearer "), code: U, msg: "authorization header must be 'Bearer <token>'",
			reason: "bad_authorization_header"},
		{name: "token/garbage", do: with("not-a-jwt"), code: U, msg: tokenMsg, reason: "token_malformed"},
		{name: "token/none at all", do: a.do(probe{req: req}), code: U, msg: "no credentials", reason: "no_credentials"},
		{name: "clusterid/unknown", do: a.do(probe{token: a.web.Token, noClusterID: true, md: []string{authpb.HeaderClusterID, "elsewhere"}, req: req}),
			code: U, msg: `unknown cluster "elsewhere"`, reason: "unknown_cluster"},
		{name: "clusterid/two headers", do: with(a.web.Token, authpb.HeaderClusterID, "elsewhere"), code: U,
			msg: "send at most one clusterid header", reason: "bad_cluster_header"},
	}
}

// boundClaims are the claims of a bound token as the apiserver writes
// them, for forgeries.
func boundClaims(a *arena, ns, sa, pod string) map[string]any {
	now := time.Now()
	return map[string]any{
		"iss": cluster.Issuer, "sub": "system:serviceaccount:" + ns + ":" + sa, "aud": []string{"istio-ca"},
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"kubernetes.io": map[string]any{"namespace": ns, "serviceaccount": map[string]string{"name": sa},
			"pod": map[string]string{"name": pod}, "node": map[string]string{"name": a.web.Node}},
	}
}

func withClaim(claims map[string]any, k string, v any) map[string]any {
	out := map[string]any{k: v}
	for ck, cv := range claims {
		if ck != k {
			out[ck] = cv
		}
	}
	return out
}

// signJWT signs claims with key (RS256), or leaves the signature empty
// for alg "none".
func signJWT(t *testing.T, key *rsa.PrivateKey, alg string, claims map[string]any) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signing := enc(map[string]string{"alg": alg, "typ": "JWT"}) + "." + enc(claims)
	if key == nil {
		return signing + "."
	}
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// legacyToken makes the token Kubernetes' token controller used to put in
// a service-account-token Secret: issuer kubernetes/serviceaccount, no
// audience, no expiry, bound to the Secret only. It logs whether the
// apiserver authenticates it without an audience, which is what makes
// refusing it meaningful.
func (a *arena) legacyToken(t *testing.T, ns, sa string) string {
	t.Helper()
	ctx := context.Background()
	acct, err := cluster.Client.CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(cluster.SAKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pemutil.ParsePrivateKey(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	name := sa + "-legacy-token"
	token := signJWT(t, key.(*rsa.PrivateKey), "RS256", map[string]any{
		"iss":                                    "kubernetes/serviceaccount",
		"sub":                                    "system:serviceaccount:" + ns + ":" + sa,
		"kubernetes.io/serviceaccount/namespace": ns,
		"kubernetes.io/serviceaccount/secret.name":          name,
		"kubernetes.io/serviceaccount/service-account.name": sa,
		"kubernetes.io/serviceaccount/service-account.uid":  string(acct.UID),
	})
	_, err = cluster.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
			corev1.ServiceAccountNameKey: sa, corev1.ServiceAccountUIDKey: string(acct.UID)}},
		Type: corev1.SecretTypeServiceAccountToken,
		Data: map[string][]byte{corev1.ServiceAccountTokenKey: []byte(token)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cluster.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the apiserver, asked without an audience, says of the legacy token: authenticated=%v user=%q error=%q",
		tr.Status.Authenticated, tr.Status.User.Username, tr.Status.Error)
	return token
}

// hugeHeaderAttack sends a 1 MiB bearer token from a client that ignores
// the server's SETTINGS_MAX_HEADER_LIST_SIZE (grpc-go's own client would
// refuse to send it). The transport must drop it before meshca's code
// holds it: README says a single huge header closes the connection. The
// outcome is mapped to the code a gRPC client would report (gRPC's
// HTTP/2 protocol spec: a closed connection or GOAWAY is Unavailable).
func (a *arena) hugeHeaderAttack(t *testing.T) attack {
	marker := "eyJ" + strings.Repeat("M", 29) // a needle for the log check
	token := marker + strings.Repeat("A", 1<<20)
	a.secret(marker)
	return attack{name: "token/1 MiB, past the transport's header limit", transport: true, code: codes.Unavailable, msg: "http2:",
		do: func(ctx context.Context) (*authpb.IstioCertificateResponse, error) {
			return nil, rawHTTP2Request(ctx, a.s.Addr, &tls.Config{RootCAs: a.roots, ServerName: "istiod.istio-system.svc",
				NextProtos: []string{"h2"}}, [][2]string{{"authorization", "Bearer " + token}})
		}}
}

// rawHTTP2Request speaks HTTP/2 by hand (HPACK literals, no Huffman) as an
// attacker would: one CreateCertificate with the extra headers and an
// empty message. It returns the gRPC status a client would derive from
// how the server ended the stream.
func rawHTTP2Request(ctx context.Context, addr string, tc *tls.Config, extra [][2]string) error {
	d := tls.Dialer{Config: tc}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return status.Errorf(codes.Unavailable, "http2: dial: %v", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	var block []byte
	for _, h := range append([][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "istiod.istio-system.svc"},
		{":path", "/istio.v1.auth.IstioCertificateService/CreateCertificate"}, {"content-type", "application/grpc"},
		{"te", "trailers"}}, extra...) {
		block = hpackLiteral(block, h[0], h[1])
	}
	// The writes race the server closing the connection; a failed write
	// is read as the server's answer below.
	go func() {
		_, _ = io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
		_ = writeFrame(c, 0x4, 0, 0, nil) // SETTINGS
		const chunk = 16 << 10
		for typ, first := byte(0x1), true; len(block) > 0 || first; typ, first = 0x9, false {
			n := min(chunk, len(block))
			flags := byte(0)
			if n == len(block) {
				flags = 0x4 // END_HEADERS
			}
			if writeFrame(c, typ, flags, 1, block[:n]) != nil {
				return
			}
			block = block[n:]
		}
		_ = writeFrame(c, 0x0, 0x1, 1, []byte{0, 0, 0, 0, 0}) // DATA, END_STREAM: an empty request
	}()
	hdr := make([]byte, 9)
	for {
		if _, err := io.ReadFull(c, hdr); err != nil {
			return status.Errorf(codes.Unavailable, "http2: connection closed: %v", err)
		}
		payload := make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))
		if _, err := io.ReadFull(c, payload); err != nil {
			return status.Errorf(codes.Unavailable, "http2: connection closed: %v", err)
		}
		stream := binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff
		switch typ := hdr[3]; {
		case typ == 0x7 && len(payload) >= 8: // GOAWAY
			return status.Errorf(codes.Unavailable, "http2: GOAWAY error code %d", binary.BigEndian.Uint32(payload[4:]))
		case typ == 0x3 && stream == 1 && len(payload) == 4: // RST_STREAM
			code := binary.BigEndian.Uint32(payload)
			return status.Errorf(rstCode(code), "http2: RST_STREAM error code %d", code)
		case typ == 0x1 && stream == 1:
			return errors.New("http2: the server answered the request with HEADERS")
		}
	}
}

// rstCode maps an RST_STREAM error code to a gRPC code as gRPC's HTTP/2
// protocol specification does.
func rstCode(c uint32) codes.Code {
	switch c {
	case 0x7: // REFUSED_STREAM
		return codes.Unavailable
	case 0x8: // CANCEL
		return codes.Canceled
	case 0xb: // ENHANCE_YOUR_CALM
		return codes.ResourceExhausted
	case 0xc: // INADEQUATE_SECURITY
		return codes.PermissionDenied
	}
	return codes.Internal
}

func writeFrame(w io.Writer, typ, flags byte, stream uint32, payload []byte) error {
	h := make([]byte, 9, 9+len(payload))
	h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	h[3], h[4] = typ, flags
	binary.BigEndian.PutUint32(h[5:], stream)
	_, err := w.Write(append(h, payload...))
	return err
}

// hpackLiteral appends a literal header field without indexing, new name
// (RFC 7541, 6.2.2), strings without Huffman coding.
func hpackLiteral(b []byte, name, value string) []byte {
	b = append(b, 0x00)
	b = hpackInt(b, len(name))
	b = append(b, name...)
	b = hpackInt(b, len(value))
	return append(b, value...)
}

// hpackInt appends n with a 7-bit prefix (RFC 7541, 5.1).
func hpackInt(b []byte, n int) []byte {
	if n < 127 {
		return append(b, byte(n))
	}
	b, n = append(b, 127), n-127
	for ; n >= 128; n /= 128 {
		b = append(b, byte(n%128+128))
	}
	return append(b, byte(n))
}
