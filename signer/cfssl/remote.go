package cfssl

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cloudflare/cfssl/auth"
	cfsigner "github.com/cloudflare/cfssl/signer"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/signer"
)

// maxAnswer bounds what meshca reads of a cfssl answer: a certificate
// and some JSON.
const maxAnswer = 1 << 20

// RemoteConfig configures signing through a cfssl server.
type RemoteConfig struct {
	// URL of one server, e.g. https://cfssl.pki.svc:8888. Without a scheme
	// it is http; without a port, cfssl's 8888.
	URL string
	// TLS for an https URL; nil uses the system roots.
	TLS *tls.Config
	// AuthKey, when set, makes requests authsign requests with this hex
	// HMAC key (cfssl's "standard" auth provider).
	AuthKey string
	// Profile is the server's profile for every request, except those
	// KeyEnciphermentProfile takes. A cfssl server takes a certificate's
	// usages from the profile alone, so it must grant exactly digital
	// signature, server auth and client auth.
	Profile string
	// KeyEnciphermentProfile, when set, is the profile for requests whose
	// certificate must also carry key encipherment (RSA keys): its usages
	// are digital signature, key encipherment, server auth and client
	// auth. When empty, Profile serves every request and an RSA request is
	// refused unless Profile grants exactly what RSA keys get.
	KeyEnciphermentProfile string
	// DNSProfile is the profile for DNS requests (istiod's serving
	// certificate): digital signature, server auth and client auth, and
	// the DNS names it may name. Empty: DNS requests are refused.
	DNSProfile string
	Label      string
	// Issuer is the certificate the server signs with. When nil it is read
	// from the server's info endpoint at the first request. Either way it
	// only shapes the chain: trust comes from meshca's pinned trust anchors.
	Issuer *x509.Certificate
	// Chain holds the certificates above the issuer, without the root.
	Chain []*x509.Certificate
	// Timeout bounds every call to the server; 30s when zero.
	Timeout time.Duration
	// Backdate is how far before now leaves start, as in
	// certs.WindowOptions: zero means certs.Backdate.
	Backdate time.Duration
	Now      func() time.Time
}

// NewRemote returns a signer that calls a cfssl server. It does no I/O.
func NewRemote(c RemoteConfig) (*Signer, error) {
	quiet()
	base, err := serverURL(c.URL)
	if err != nil {
		return nil, err
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = c.TLS
	b := &remoteBackend{base: base, client: &http.Client{Transport: transport, Timeout: c.Timeout}}
	if c.AuthKey != "" {
		if b.auth, err = auth.New(c.AuthKey, nil); err != nil {
			return nil, fmt.Errorf("cfssl: auth key: %w", err)
		}
	}
	b.issuers = &issuerCache{cert: c.Issuer, timeout: c.Timeout, fetch: func(ctx context.Context) (*x509.Certificate, error) {
		return b.info(ctx, c.Label, c.Profile)
	}}
	return &Signer{backend: b, chain: c.Chain, profile: c.Profile, keProfile: c.KeyEnciphermentProfile, dnsProfile: c.DNSProfile, label: c.Label, backdate: c.Backdate, now: nowOr(c.Now)}, nil
}

// serverURL checks a server URL and returns it without a trailing slash.
func serverURL(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	switch {
	case raw == "":
		return "", errors.New("cfssl: server URL is required")
	case strings.Contains(raw, ","):
		return "", fmt.Errorf("cfssl: server URL %q: give one server", raw)
	case !strings.Contains(raw, "://"):
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "", fmt.Errorf("cfssl: server URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("cfssl: server URL %q: the scheme must be http or https", u.Redacted())
	case u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.Trim(u.Path, "/") != "":
		return "", fmt.Errorf("cfssl: server URL %q: want scheme://host[:port] only", u.Redacted())
	}
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), "8888")
	}
	return u.Scheme + "://" + u.Host, nil
}

// remoteBackend speaks cfssl's HTTP API.
type remoteBackend struct {
	base    string
	client  *http.Client
	auth    auth.Provider // nil: unauthenticated sign
	issuers *issuerCache
}

// wireSignRequest is all a cfssl server (up to v1.6.5 at least) reads
// from a sign request: the subject, usages and validity of what it
// issues come from its profile, whatever else a request holds.
type wireSignRequest struct {
	Hosts   []string `json:"hosts"`
	Request string   `json:"certificate_request"`
	Profile string   `json:"profile"`
	Label   string   `json:"label"`
}

func (b *remoteBackend) issuer(ctx context.Context) (*x509.Certificate, error) {
	return b.issuers.get(ctx)
}

func (b *remoteBackend) reissuer(ctx context.Context, stale *x509.Certificate) (*x509.Certificate, error) {
	b.issuers.forget(stale)
	return b.issuers.get(ctx)
}

func (b *remoteBackend) sign(ctx context.Context, req cfsigner.SignRequest, _ csr.Usages) ([]byte, error) {
	body, err := json.Marshal(wireSignRequest{Hosts: req.Hosts, Request: req.Request, Profile: req.Profile, Label: req.Label})
	if err != nil {
		return nil, signer.Errorf(name, signer.KindInternal, "encode request: %w", err)
	}
	endpoint := "sign"
	if b.auth != nil {
		token, err := b.auth.Token(body)
		if err != nil {
			return nil, signer.Errorf(name, signer.KindInternal, "auth token: %w", err)
		}
		if body, err = json.Marshal(auth.AuthenticatedRequest{Timestamp: time.Now().Unix(), Token: token, Request: body}); err != nil {
			return nil, signer.Errorf(name, signer.KindInternal, "encode request: %w", err)
		}
		endpoint = "authsign"
	}
	var res struct {
		Certificate string `json:"certificate"`
	}
	if err := b.call(ctx, endpoint, body, &res); err != nil {
		return nil, err
	}
	return []byte(res.Certificate), nil
}

// RemoteIssuer reads the certificate the cfssl server c names signs with
// now (for c.Label and c.Profile), from its info endpoint.
func RemoteIssuer(ctx context.Context, c RemoteConfig) (*x509.Certificate, error) {
	s, err := NewRemote(c)
	if err != nil {
		return nil, err
	}
	return s.backend.(*remoteBackend).info(ctx, c.Label, c.Profile)
}

// info reads the certificate the server signs with for label and profile.
func (b *remoteBackend) info(ctx context.Context, label, profile string) (*x509.Certificate, error) {
	body, err := json.Marshal(map[string]string{"label": label, "profile": profile})
	if err != nil {
		return nil, signer.Errorf(name, signer.KindInternal, "encode info request: %w", err)
	}
	var res struct {
		Certificate string `json:"certificate"`
	}
	if err := b.call(ctx, "info", body, &res); err != nil {
		return nil, err
	}
	certs, err := pemutil.ParseCertificates([]byte(res.Certificate))
	if err != nil {
		return nil, signer.Errorf(name, signer.KindInternal, "server's info certificate: %w", err)
	}
	return certs[0], nil
}

// answer is cfssl's response envelope.
type answer struct {
	Success bool            `json:"success"`
	Result  json.RawMessage `json:"result"`
	Errors  []struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"errors"`
}

// call posts body to a cfssl API endpoint and decodes the result into
// result. It classifies every failure once, for every endpoint: a server
// that cannot be reached, times out, fails (5xx, 429) or answers with
// something that is not a cfssl answer is KindUnavailable (clients
// retry); cfssl's own refusal (4xx, or an answer without success) is
// KindRefused (an operator must act).
func (b *remoteBackend) call(ctx context.Context, endpoint string, body []byte, result any) error {
	unavailable := func(format string, args ...any) error {
		return signer.Errorf(name, signer.KindUnavailable, format, args...)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+"/api/v1/cfssl/"+endpoint, bytes.NewReader(body))
	if err != nil {
		return signer.Errorf(name, signer.KindInternal, "%s request: %w", endpoint, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			// The caller's deadline, not the server, ended the call.
			return unavailable("%s: %w", endpoint, ctx.Err())
		}
		return unavailable("%w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return unavailable("%s: reading the answer: %w", endpoint, err)
	}
	var a answer
	jsonErr := json.Unmarshal(data, &a)
	switch {
	case resp.StatusCode >= 500, resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusRequestTimeout:
		return unavailable("%s: server answered %s: %s", endpoint, resp.Status, detail(a, jsonErr, data))
	case resp.StatusCode != http.StatusOK:
		return signer.Errorf(name, signer.KindRefused, "%s refused (%s): %s", endpoint, resp.Status, detail(a, jsonErr, data))
	case jsonErr != nil:
		return unavailable("%s: the answer is not a cfssl response (%v): %s", endpoint, jsonErr, snippet(data))
	case !a.Success:
		return signer.Errorf(name, signer.KindRefused, "%s refused: %s", endpoint, detail(a, nil, data))
	}
	if err := json.Unmarshal(a.Result, result); err != nil {
		return signer.Errorf(name, signer.KindInternal, "%s: unexpected result %s: %v", endpoint, snippet(a.Result), err)
	}
	return nil
}

// detail is cfssl's own error messages when the body holds them, else the
// start of the body.
func detail(a answer, jsonErr error, body []byte) string {
	if jsonErr != nil || len(a.Errors) == 0 {
		return snippet(body)
	}
	msgs := make([]string, len(a.Errors))
	for i, e := range a.Errors {
		msgs[i] = fmt.Sprintf("%s (code %d)", e.Message, e.Code)
	}
	return strings.Join(msgs, "; ")
}

// snippet is the start of a body, printable, for an error message.
func snippet(b []byte) string {
	const max = 200
	s := strings.TrimSpace(strings.ToValidUTF8(string(b), "?"))
	if len(s) > max {
		s = s[:max] + "..."
	}
	if s == "" {
		return "(empty)"
	}
	return fmt.Sprintf("%q", s)
}
