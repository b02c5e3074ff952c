package vault_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/vault"
	"github.com/meshca/meshca/vaultauth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// fakeVault stands in for Vault. AppRole logins hand out tok-1, tok-2, ...
// (lookup-self, a TokenFile login, counts as a login too); pki/sign/<role>
// answers 403 to the tokens deny refuses and issues a leaf to the others,
// with the key usages of the role whatever the key (as Vault does): role
// "mesh" grants digital signature, "mesh-rsa" digital signature and key
// encipherment, other roles are unknown; the leaf lives an hour whatever
// the ttl asked (as under a role with not_after); auth/token/revoke-self
// records the token that asked.
type fakeVault struct {
	srv  *httptest.Server
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	deny func(token string) bool

	mu      sync.Mutex
	logins  int
	renews  int // auth/token/renew-self calls, answered or refused
	revoked []string
	signed  []string // the roles that signed, in order
	// tokens is how logins hand out tokens (set it before the first).
	tokens fakeTokens
	// edit, when set, changes the data of every pki/sign answer.
	edit func(data map[string]any)
	// opened counts the connections clients opened.
	opened atomic.Int64
}

// fakeTokens shape the tokens fakeVault hands out. The zero value is
// tokens of an hour that do not renew.
type fakeTokens struct {
	lease      int  // seconds a login's token lives; 0: 3600, -1: forever
	renewable  bool // auth/token/renew-self renews it to renewLease
	renewLease int
	failLogins bool // logins answer 500
	// failRenewals: auth/token/renew-self answers 400, as Vault does for
	// a token past its max TTL.
	failRenewals bool
	// expiring: lookup-self shows a token with less than a second left
	// (ttl 0, as Vault rounds it, and an expire_time).
	expiring bool
}

func (t fakeTokens) loginLease() int {
	switch t.lease {
	case 0:
		return 3600
	case -1:
		return 0
	}
	return t.lease
}

// fakeRoles are the roles of fakeVault and the key usages they grant.
var fakeRoles = map[string]x509.KeyUsage{
	"mesh":     x509.KeyUsageDigitalSignature,
	"mesh-rsa": x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
}

func newFakeVault(t *testing.T, deny func(token string) bool) *fakeVault {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake vault CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeVault{ca: ca, key: key, deny: deny}
	f.srv = httptest.NewUnstartedServer(f)
	f.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.opened.Add(1)
		}
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeVault) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token := r.Header.Get("X-Vault-Token")
	if role, ok := strings.CutPrefix(r.URL.Path, "/v1/pki/sign/"); ok {
		ku, known := fakeRoles[role]
		switch {
		case !known:
			writeJSON(w, http.StatusBadRequest, map[string]any{"errors": []string{"unknown role: " + role}})
		case token == "" || f.deny(token):
			writeJSON(w, http.StatusForbidden, map[string]any{"errors": []string{"permission denied"}})
		default:
			f.mu.Lock()
			f.signed = append(f.signed, role)
			f.mu.Unlock()
			f.sign(w, r, ku)
		}
		return
	}
	f.mu.Lock()
	tok := f.tokens
	f.mu.Unlock()
	switch r.URL.Path {
	case "/v1/auth/approle/login", "/v1/auth/token/lookup-self":
		if tok.failLogins {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"errors": []string{"login backend down"}})
			return
		}
		f.mu.Lock()
		f.logins++
		n := f.logins
		f.mu.Unlock()
		if r.URL.Path == "/v1/auth/token/lookup-self" { // a TokenFile login
			data := map[string]any{"ttl": tok.loginLease(), "renewable": tok.renewable, "expire_time": nil}
			if tok.expiring {
				data["ttl"], data["expire_time"] = 0, time.Now().Add(500*time.Millisecond).Format(time.RFC3339Nano)
			}
			writeJSON(w, http.StatusOK, map[string]any{"data": data})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"auth": map[string]any{
			"client_token": fmt.Sprintf("tok-%d", n), "lease_duration": tok.loginLease(), "renewable": tok.renewable,
		}})
	case "/v1/auth/token/renew-self":
		f.mu.Lock()
		f.renews++
		f.mu.Unlock()
		if tok.failRenewals {
			writeJSON(w, http.StatusBadRequest, map[string]any{"errors": []string{"past the max TTL, cannot renew"}})
			return
		}
		if !tok.renewable {
			writeJSON(w, http.StatusBadRequest, map[string]any{"errors": []string{"lease is not renewable"}})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"auth": map[string]any{
			"client_token": token, "lease_duration": tok.renewLease, "renewable": true,
		}})
	case "/v1/auth/token/revoke-self":
		f.mu.Lock()
		f.revoked = append(f.revoked, token)
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	default:
		writeJSON(w, http.StatusNotFound, map[string]any{"errors": []string{"no handler for " + r.URL.Path}})
	}
}

// sign issues a leaf with key usages ku, server auth and client auth for
// the CSR and URI SAN in the request body.
func (f *fakeVault) sign(w http.ResponseWriter, r *http.Request, ku x509.KeyUsage) {
	var body struct {
		CSR     string `json:"csr"`
		URISANs string `json:"uri_sans"`
	}
	fail := func(err error) {
		writeJSON(w, http.StatusBadRequest, map[string]any{"errors": []string{err.Error()}})
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		fail(err)
		return
	}
	block, _ := pem.Decode([]byte(body.CSR))
	if block == nil {
		fail(fmt.Errorf("no CSR"))
		return
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		fail(err)
		return
	}
	uri, err := url.Parse(body.URISANs)
	if err != nil {
		fail(err)
		return
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), URIs: []*url.URL{uri},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: ku, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.ca, req.PublicKey, f.key)
	if err != nil {
		fail(err)
		return
	}
	data := map[string]any{
		"certificate": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		"issuing_ca":  string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.ca.Raw})),
	}
	f.mu.Lock()
	edit := f.edit
	f.mu.Unlock()
	if edit != nil {
		edit(data)
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": data})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// roles returns the roles that signed so far, in order.
func (f *fakeVault) roles() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.signed)
}

// counts returns the number of logins and the tokens revoked so far.
func (f *fakeVault) counts() (int, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.logins, slices.Clone(f.revoked)
}

// renewals returns the number of renew-self calls so far.
func (f *fakeVault) renewals() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renews
}

// waitRevoked waits until want tokens were revoked (revocation runs after
// the login it follows) and returns them.
func (f *fakeVault) waitRevoked(t *testing.T, want int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, revoked := f.counts()
		if len(revoked) >= want || time.Now().After(deadline) {
			return revoked
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newSigner returns a Vault signer for f with c's roles ("mesh" when
// c.Role is empty), clock, backoff, login error report and login method
// (AppRole when c.Auth is nil).
func (f *fakeVault) newSigner(t *testing.T, c vault.Config) *vault.Signer {
	t.Helper()
	if c.Auth == nil {
		secretID := filepath.Join(t.TempDir(), "secret-id")
		if err := os.WriteFile(secretID, []byte("the-secret-id"), 0o600); err != nil {
			t.Fatal(err)
		}
		auth, err := vaultauth.AppRole("", "the-role-id", secretID, "")
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	}
	c.Address, c.Timeout = f.srv.URL, 5*time.Second
	if c.Role == "" {
		c.Role = "mesh"
	}
	s, err := vault.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newRequest returns a signing request for id with a fresh P-256 key.
func newRequest(t *testing.T, id spiffeid.ID) *signer.Request {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return newRequestFor(t, id, key)
}

// newRequestFor returns a signing request for id with key and the usages
// meshca derives from it.
func newRequestFor(t *testing.T, id spiffeid.ID, key crypto.Signer) *signer.Request {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{id.URL()}}, key)
	if err != nil {
		t.Fatal(err)
	}
	req, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	return &signer.Request{CSR: req, ID: id, TTL: time.Hour, Usages: csr.WorkloadUsages(req.PublicKey)}
}
