package cfssl_test

import (
	"context"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudflare/cfssl/api/info"
	"github.com/cloudflare/cfssl/api/signhandler"
	"github.com/cloudflare/cfssl/config"
	cfsigner "github.com/cloudflare/cfssl/signer"
	cflocal "github.com/cloudflare/cfssl/signer/local"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/cfssl"
	"github.com/meshca/meshca/signer/signertest"
)

const testAuthKey = "0123456789abcdef0123456789abcdef"

// serverConfig is a cfssl server configuration as docs/signers/cfssl.md
// should give it: a profile for EC keys and one for RSA keys, both taking
// only the key from a CSR. auth adds an auth key to both.
func serverConfig(whitelist, auth bool) string {
	wl, ak, keys := "", "", ""
	if whitelist {
		wl = `, "CSRWhitelist": {"PublicKey": true, "PublicKeyAlgorithm": true, "SignatureAlgorithm": true}`
	}
	if auth {
		ak = `, "auth_key": "meshca"`
		keys = `, "auth_keys": {"meshca": {"type": "standard", "key": "` + testAuthKey + `"}}`
	}
	return `{"signing": {
	  "default": {"usages": ["digital signature", "server auth", "client auth"], "expiry": "24h", "backdate": "2m"` + wl + ak + `},
	  "profiles": {"rsa": {"usages": ["digital signature", "key encipherment", "server auth", "client auth"], "expiry": "24h", "backdate": "2m"` + wl + ak + `},
	    "istiod": {"usages": ["digital signature", "server auth", "client auth"], "expiry": "24h", "backdate": "2m"` + wl + ak + `}}
	}` + keys + `}`
}

// startCfssl serves cfssl's own sign, authsign and info handlers over a,
// the way `cfssl serve` wires them.
func startCfssl(tb testing.TB, a *keymgr.Authority, configJSON string) *httptest.Server {
	tb.Helper()
	cfg, err := config.LoadConfig([]byte(configJSON))
	if err != nil {
		tb.Fatal(err)
	}
	s, err := cflocal.NewSigner(a.Key, a.Cert, cfsigner.DefaultSigAlgo(a.Key), cfg.Signing)
	if err != nil {
		tb.Fatal(err)
	}
	mux := http.NewServeMux()
	if h, err := signhandler.NewHandlerFromSigner(s); err == nil {
		mux.Handle("/api/v1/cfssl/sign", h)
	}
	if h, err := signhandler.NewAuthHandlerFromSigner(s); err == nil {
		mux.Handle("/api/v1/cfssl/authsign", h)
	}
	h, err := info.NewHandler(s)
	if err != nil {
		tb.Fatal(err)
	}
	mux.Handle("/api/v1/cfssl/info", h)
	srv := httptest.NewServer(mux)
	tb.Cleanup(srv.Close)
	return srv
}

// TestContractRemote: a remote server configured as documented passes the
// contract, RSA and EC keys alike, signing with and without an auth key.
func TestContractRemote(t *testing.T) {
	for _, auth := range []bool{false, true} {
		t.Run(fmt.Sprintf("auth=%v", auth), func(t *testing.T) {
			signertest.Run(t, signertest.Backend{
				FixedLifetime: 24 * time.Hour,
				DNS:           true,
				New: func(tb testing.TB, a *keymgr.Authority) signer.Signer {
					srv := startCfssl(tb, a, serverConfig(true, auth))
					c := cfssl.RemoteConfig{URL: srv.URL, KeyEnciphermentProfile: "rsa", DNSProfile: "istiod", Chain: a.Chain}
					if auth {
						c.AuthKey = testAuthKey
					}
					s, err := cfssl.NewRemote(c)
					if err != nil {
						tb.Fatal(err)
					}
					return s
				},
			})
		})
	}
}

// TestRemoteRefusesWhatTheProfileDecides: a remote server decides subject
// and usages from its profile alone; what breaks meshca's rules is
// refused, with a hint at the profile setting that fixes it.
func TestRemoteRefusesWhatTheProfileDecides(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	a := root.Authority()
	copying := startCfssl(t, a, serverConfig(false, false))
	documented := startCfssl(t, a, serverConfig(true, false)) // expiry 24h
	tests := []struct {
		name    string
		cfg     cfssl.RemoteConfig
		key     string
		subject pkix.Name
		want    []string
	}{
		{"subject copied from the CSR", cfssl.RemoteConfig{URL: copying.URL}, "ec", pkix.Name{Organization: []string{"system:masters"}, OrganizationalUnit: []string{"ops"}},
			[]string{`subject "OU=ops,O=system:masters", want an empty subject`, `"CSRWhitelist"`}},
		{"istio-agent's empty organization copied", cfssl.RemoteConfig{URL: copying.URL}, "ec", pkix.Name{Organization: []string{""}},
			[]string{`subject "O=", want an empty subject`}},
		{"RSA key, no key encipherment profile", cfssl.RemoteConfig{URL: copying.URL}, "rsa", pkix.Name{},
			[]string{`lacks key usage ["key encipherment"]`}},
		{"EC key sent to the RSA profile", cfssl.RemoteConfig{URL: copying.URL, Profile: "rsa"}, "ec", pkix.Name{},
			[]string{`key usage ["digital signature" "key encipherment"] goes beyond the allowed ["digital signature"]`}},
		{"profile's expiry past the requested TTL", cfssl.RemoteConfig{URL: documented.URL}, "ec", pkix.Name{},
			[]string{"past the requested lifetime", "set the profile's expiry to at most the TTL clients request"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := cfssl.NewRemote(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Sign(context.Background(), request(t, newKey(t, tt.key), tt.subject))
			if signer.KindOf(err) != signer.KindRefused {
				t.Fatalf("err = %v, want %s", err, signer.KindRefused)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to contain %q", err, w)
				}
			}
		})
	}
}

// TestRemoteFailureKinds: an outage is KindUnavailable (clients retry);
// only cfssl's own refusal is KindRefused.
func TestRemoteFailureKinds(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	refusal := `{"success":false,"result":null,"errors":[{"code":1003,"message":"Policy violation request"}],"messages":[]}`
	reply := func(status int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(status)
			fmt.Fprint(w, body)
		}
	}
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	tests := []struct {
		name    string
		handler http.Handler // nil: nothing listens
		issuer  bool         // false: the issuer is read from info
		timeout time.Duration
		kind    signer.Kind
		want    string
	}{
		{"503 from a proxy", reply(http.StatusServiceUnavailable, "<html>no healthy upstream</html>"), true, 0, signer.KindUnavailable, "503 Service Unavailable"},
		{"500 from cfssl", reply(http.StatusInternalServerError, `{"success":false,"result":null,"errors":[{"code":500,"message":"database is locked"}],"messages":[]}`), true, 0, signer.KindUnavailable, "database is locked (code 500)"},
		{"502", reply(http.StatusBadGateway, "bad gateway"), true, 0, signer.KindUnavailable, "502 Bad Gateway"},
		{"429", reply(http.StatusTooManyRequests, "slow down"), true, 0, signer.KindUnavailable, "429"},
		{"garbage with 200", reply(http.StatusOK, "<html>captive portal</html>"), true, 0, signer.KindUnavailable, "not a cfssl response"},
		{"truncated JSON", reply(http.StatusOK, `{"success":true,"result":{"certificate":"-----BEGIN CERT`), true, 0, signer.KindUnavailable, "not a cfssl response"},
		{"body cut short", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "1000")
			fmt.Fprint(w, `{"success":true,`)
		}), true, 0, signer.KindUnavailable, "reading the answer"},
		{"connection refused", nil, true, 0, signer.KindUnavailable, "connection refused"},
		{"deadline", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // then the server notices the client leave
			<-r.Context().Done()
		}), true, 200 * time.Millisecond, signer.KindUnavailable, "deadline exceeded"},
		{"info endpoint down", reply(http.StatusServiceUnavailable, "down"), false, 0, signer.KindUnavailable, "info: server answered 503"},
		{"cfssl refuses with 400", reply(http.StatusBadRequest, refusal), true, 0, signer.KindRefused, "Policy violation request (code 1003)"},
		{"cfssl refuses with 200", reply(http.StatusOK, refusal), true, 0, signer.KindRefused, "Policy violation request"},
		{"invalid token", reply(http.StatusBadRequest, `{"success":false,"result":null,"errors":[{"code":400,"message":"invalid token"}],"messages":[]}`), true, 0, signer.KindRefused, "invalid token"},
		{"wrong path (404)", http.NotFoundHandler(), true, 0, signer.KindRefused, "404 Not Found"},
		{"success without a certificate", reply(http.StatusOK, `{"success":true,"result":{"certificate":""},"errors":[],"messages":[]}`), true, 0, signer.KindInternal, "no single certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := down.URL
			if tt.handler != nil {
				srv := httptest.NewServer(tt.handler)
				t.Cleanup(srv.Close)
				url = srv.URL
			}
			c := cfssl.RemoteConfig{URL: url}
			if tt.issuer {
				c.Issuer = root.Cert
			}
			s, err := cfssl.NewRemote(c)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			_, err = s.Sign(ctx, request(t, newKey(t, "ec"), pkix.Name{}))
			var se *signer.Error
			if !errors.As(err, &se) || se.Kind != tt.kind || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want kind %s containing %q", err, tt.kind, tt.want)
			}
		})
	}
}

// TestIssuerWaitHonoursDeadline: while one request waits on a slow info
// endpoint, another with a short deadline gives up at its deadline instead
// of queueing behind the first; the fetch is shared, and a failed one is
// tried again by the next request.
func TestIssuerWaitHonoursDeadline(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	var (
		calls   atomic.Int32
		entered = make(chan struct{}, 10)
		release = make(chan struct{})
		fail    atomic.Bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/cfssl/info" {
			http.Error(w, `{"success":false,"errors":[{"code":1,"message":"not here"}]}`, http.StatusBadRequest)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		calls.Add(1)
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		if fail.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, `{"success":true,"result":{"certificate":%q},"errors":[],"messages":[]}`, pemutil.EncodeCertificates(root.Cert))
	}))
	t.Cleanup(srv.Close)
	s, err := cfssl.NewRemote(cfssl.RemoteConfig{URL: srv.URL, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := s.Sign(ctx, request(t, newKey(t, "ec"), pkix.Name{}))
		first <- err
	}()
	<-entered // the first request is blocked on the info endpoint

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.Sign(ctx, request(t, newKey(t, "ec"), pkix.Name{}))
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the second request returned after %v, past its 100ms deadline", d)
	}
	if signer.KindOf(err) != signer.KindUnavailable || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want %s with the deadline", err, signer.KindUnavailable)
	}

	// The shared fetch fails; the first request sees that, and the next
	// request fetches again.
	fail.Store(true)
	close(release)
	if err := <-first; signer.KindOf(err) != signer.KindUnavailable || !strings.Contains(err.Error(), "503") {
		t.Fatalf("first request: err = %v, want the info endpoint's 503", err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d info calls, want the two requests to share one", n)
	}
	fail.Store(false)
	_, err = s.Sign(context.Background(), request(t, newKey(t, "ec"), pkix.Name{}))
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d info calls, want a failed fetch tried again", n)
	}
	// This server answers only info: the issuer was read, and the request
	// went on to sign.
	if signer.KindOf(err) != signer.KindRefused || !strings.Contains(err.Error(), "sign refused") {
		t.Fatalf("err = %v, want the sign call refused", err)
	}
}

func TestNewRemoteURL(t *testing.T) {
	tests := []struct {
		url  string
		want string // "" accepted
	}{
		{"https://cfssl.pki.svc:8888", ""},
		{"cfssl.pki.svc:8888", ""},
		{"http://[::1]:8888/", ""},
		{"", "server URL is required"},
		{"http://a:8888,http://b:8888", "give one server"},
		{"ftp://cfssl:8888", "scheme must be http or https"},
		{"http://cfssl:8888/api/v1/cfssl", "want scheme://host[:port] only"},
		{"http://user:pw@cfssl:8888", "want scheme://host[:port] only"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			_, err := cfssl.NewRemote(cfssl.RemoteConfig{URL: tt.url})
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "pw") {
				t.Fatalf("err = %v shows the URL's password", err)
			}
		})
	}
}
