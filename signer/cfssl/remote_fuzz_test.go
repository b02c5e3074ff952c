package cfssl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// fuzzNow is the remote signer's clock in the fuzz target, so that its
// stored inputs, whose certificates are valid then, reproduce.
var fuzzNow = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)

// fuzzServer answers the remote signer from memory: no network. info
// answers the info endpoint with 200; every other endpoint gets status
// and sign.
type fuzzServer struct {
	status     int
	sign, info []byte
}

func (s fuzzServer) RoundTrip(r *http.Request) (*http.Response, error) {
	status, body := s.status, s.sign
	if strings.HasSuffix(r.URL.Path, "/info") {
		status, body = http.StatusOK, s.info
	}
	return &http.Response{
		StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)),
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(bytes.NewReader(body)),
		Request: r, ProtoMajor: 1, ProtoMinor: 1,
	}, nil
}

// cfsslAnswer is a cfssl API answer with result holding certificate.
func cfsslAnswer(tb testing.TB, certificate []byte) []byte {
	b, err := json.Marshal(map[string]any{
		"success": true, "result": map[string]any{"certificate": string(certificate)}, "errors": []any{}, "messages": []any{},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// FuzzRemoteAnswer feeds a remote cfssl signer (signer/cfssl over HTTP)
// any status and body for its sign call and any body for its info call,
// served from memory: the answer decoding of call, sign and info, and
// Sign's checks of the certificate. Nothing may panic. call maps the
// answer to exactly one outcome: 5xx, 429 and 408 are KindUnavailable,
// other non-200 statuses KindRefused, a 200 that is not a cfssl answer
// KindUnavailable, an unsuccessful one KindRefused, a result of the wrong
// shape KindInternal. Sign fails only with a *signer.Error, and a
// certificate it returns passes signer.CheckIssued for the request (so
// ends no later than the requested TTL allows), and travels without a
// root.
func FuzzRemoteAnswer(f *testing.F) {
	opts := testca.Options{NotBefore: fuzzNow.Add(-time.Hour), NotAfter: fuzzNow.Add(365 * 24 * time.Hour)}
	root := testca.NewRoot(f, "cfssl root", opts)
	inter := root.NewIntermediate(f, "cfssl intermediate", opts)
	req := fuzzRequest(f)
	good := cfsslAnswer(f, pemutil.EncodeCertificates(signertest.WorkloadLeaf(f, inter, req, fuzzNow.Add(-time.Minute), fuzzNow.Add(req.TTL))))
	info := cfsslAnswer(f, pemutil.EncodeCertificates(inter.Cert))
	f.Add(uint16(200), good, info)
	f.Add(uint16(200), good, cfsslAnswer(f, pemutil.EncodeCertificates(root.Cert)))
	f.Add(uint16(200), cfsslAnswer(f, pemutil.EncodeCertificates(signertest.WorkloadLeaf(f, root, req, fuzzNow.Add(-time.Minute), fuzzNow.Add(90*24*time.Hour)))), info)
	f.Add(uint16(200), cfsslAnswer(f, pemutil.EncodeCertificates(signertest.WorkloadLeaf(f, inter, req, fuzzNow.Add(-time.Minute), fuzzNow.Add(req.TTL)), inter.Cert)), info)
	f.Add(uint16(200), []byte(`{"success":false,"result":null,"errors":[{"code":5200,"message":"Invalid or unknown policy"}],"messages":[]}`), info)
	f.Add(uint16(400), []byte(`{"success":false,"result":null,"errors":[{"code":400,"message":"Unable to parse sign request"}],"messages":[]}`), info)
	f.Add(uint16(200), []byte(`{"success":true,"result":{"certificate":5}}`), info)
	f.Add(uint16(200), []byte(`<html>proxy error</html>`), info)
	f.Add(uint16(503), []byte{}, info)
	f.Add(uint16(429), good, info)
	f.Add(uint16(302), good, info)
	f.Add(uint16(200), good, []byte(`{"success":true,"result":{"certificate":""}}`))

	f.Fuzz(func(t *testing.T, status uint16, sign, infoBody []byte) {
		code := int(status)
		if code < 100 || code > 599 {
			code = code%500 + 100
		}
		s, err := NewRemote(RemoteConfig{URL: "https://cfssl.pki.svc:8888", Profile: "mesh", Timeout: time.Minute, Now: func() time.Time { return fuzzNow }})
		if err != nil {
			t.Fatal(err)
		}
		b := s.backend.(*remoteBackend)
		b.client.Transport = fuzzServer{status: code, sign: sign, info: infoBody}
		ctx := context.Background()

		var res struct {
			Certificate string `json:"certificate"`
		}
		requireKind(t, b.call(ctx, "sign", []byte(`{}`), &res), wantKind(code, sign))

		resp, err := s.Sign(ctx, req)
		if err != nil {
			var se *signer.Error
			if !errors.As(err, &se) || se.Backend != name || (se.Kind != signer.KindUnavailable && se.Kind != signer.KindRefused && se.Kind != signer.KindInternal) {
				t.Fatalf("Sign failed with %v (%T), not a cfssl *signer.Error of a known kind", err, err)
			}
			return
		}
		if err := signer.CheckIssued(name, req, resp.Leaf, signer.Lifetime{Start: fuzzNow}); err != nil {
			t.Fatalf("Sign returned a certificate that breaks the rules: %v", err)
		}
		for _, c := range resp.Intermediates {
			if certs.IsSelfSigned(c) {
				t.Fatalf("Sign returned the root %q among the intermediates", c.Subject)
			}
		}
	})
}

// fuzzRequest is a P-256 ztunnel-shaped request of the fixed test key.
func fuzzRequest(tb testing.TB) *signer.Request {
	return signertest.FixedKeyRequest(tb, spiffeid.RequireFromString("spiffe://cluster.local/ns/shop/sa/cart"), 24*time.Hour)
}

// wantKind is how call must classify an answer: "" for success.
func wantKind(status int, body []byte) signer.Kind {
	var a struct {
		Success bool            `json:"success"`
		Result  json.RawMessage `json:"result"`
	}
	jsonErr := json.Unmarshal(body, &a)
	var res struct {
		Certificate string `json:"certificate"`
	}
	switch {
	case status >= 500, status == http.StatusTooManyRequests, status == http.StatusRequestTimeout:
		return signer.KindUnavailable
	case status != http.StatusOK:
		return signer.KindRefused
	case jsonErr != nil:
		return signer.KindUnavailable
	case !a.Success:
		return signer.KindRefused
	case json.Unmarshal(a.Result, &res) != nil:
		return signer.KindInternal
	}
	return ""
}

func requireKind(t *testing.T, err error, want signer.Kind) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("call failed on a good answer: %v", err)
		}
		return
	}
	var se *signer.Error
	if !errors.As(err, &se) || se.Kind != want {
		t.Fatalf("call: %v, want a %s *signer.Error", err, want)
	}
}
