package vaultauth_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/vaultauth"
)

// TestClassify: what a retry can cure is unavailable, the rest refused.
func TestClassify(t *testing.T) {
	status := func(code int) error { return &api.ResponseError{StatusCode: code} }
	tests := []struct {
		name string
		err  error
		want vaultauth.Kind
	}{
		{"sealed", status(http.StatusServiceUnavailable), vaultauth.KindUnavailable},
		{"internal error", status(http.StatusInternalServerError), vaultauth.KindUnavailable},
		{"rate limited", status(http.StatusTooManyRequests), vaultauth.KindUnavailable},
		{"deadline", fmt.Errorf("pki/sign: %w", context.DeadlineExceeded), vaultauth.KindUnavailable},
		{"connection refused", &url.Error{Op: "Put", URL: "http://127.0.0.1:1", Err: errors.New("connection refused")}, vaultauth.KindUnavailable},
		{"permission denied", status(http.StatusForbidden), vaultauth.KindRefused},
		{"bad request", status(http.StatusBadRequest), vaultauth.KindRefused},
		{"no such path", status(http.StatusNotFound), vaultauth.KindRefused},
		{"already classified", &vaultauth.Error{Kind: vaultauth.KindUnavailable, Err: errors.New("x")}, vaultauth.KindUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := vaultauth.KindOf(tt.err); got != tt.want {
				t.Fatalf("KindOf(%v) = %s, want %s", tt.err, got, tt.want)
			}
			if got := vaultauth.Classify(tt.err); !errors.Is(got, tt.err) && got.Err != tt.err {
				t.Fatalf("Classify(%v) lost the error: %v", tt.err, got)
			}
		})
	}
}

// fakeLogin hands out tok-1, tok-2, ... and counts its logins.
type fakeLogin struct {
	mu sync.Mutex
	n  int
}

func (f *fakeLogin) Login(context.Context, *api.Client) (*api.Secret, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return &api.Secret{Auth: &api.SecretAuth{ClientToken: fmt.Sprintf("tok-%d", f.n), LeaseDuration: 3600}}, nil
}

// TestSessionDo: a call is made logged in; a 403 (the token revoked)
// costs one fresh login and one retry, which succeeds with the new
// token; a 403 again within the backoff is refused without a login; a
// sealed Vault is unavailable.
func TestSessionDo(t *testing.T) {
	var (
		mu     sync.Mutex
		denied = map[string]bool{"tok-1": true}
		sealed bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch tok := r.Header.Get("X-Vault-Token"); {
		case sealed:
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]any{"errors": []string{"Vault is sealed"}})
		case r.URL.Path == "/v1/auth/token/revoke-self":
			w.WriteHeader(http.StatusNoContent)
		case denied[tok] || tok == "":
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]any{"errors": []string{"permission denied"}})
		default:
			_ = json.NewEncoder(w).Encode(map[string]any{"data": map[string]any{"token": tok}})
		}
	}))
	defer srv.Close()
	login := &fakeLogin{}
	s, err := vaultauth.NewSession(vaultauth.Config{Address: srv.URL, Auth: login})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	steps := []struct {
		name       string
		deny       string
		seal       bool
		wantToken  string
		wantKind   vaultauth.Kind
		wantLogins int
	}{
		{name: "tok-1 revoked: a fresh login", wantToken: "tok-2", wantLogins: 2},
		{name: "tok-2 works", wantToken: "tok-2", wantLogins: 2},
		{name: "tok-2 revoked within the backoff", deny: "tok-2", wantKind: vaultauth.KindRefused, wantLogins: 2},
		{name: "sealed", seal: true, wantKind: vaultauth.KindUnavailable, wantLogins: 2},
	}
	for _, st := range steps {
		mu.Lock()
		denied[st.deny], sealed = true, st.seal
		mu.Unlock()
		secret, err := s.Read(ctx, "transit/keys/k")
		switch {
		case st.wantKind == "" && err != nil:
			t.Fatalf("%s: %v", st.name, err)
		case st.wantKind == "" && secret.Data["token"] != st.wantToken:
			t.Fatalf("%s: called with %v, want %s", st.name, secret.Data["token"], st.wantToken)
		case st.wantKind != "" && vaultauth.KindOf(err) != st.wantKind:
			t.Fatalf("%s: got %v, want kind %s", st.name, err, st.wantKind)
		case err != nil && (!strings.Contains(err.Error(), "transit/keys/k") || strings.Contains(err.Error(), "tok-")):
			t.Fatalf("%s: %q should name the path and no token", st.name, err)
		}
		login.mu.Lock()
		n := login.n
		login.mu.Unlock()
		if n != st.wantLogins {
			t.Fatalf("%s: %d logins, want %d", st.name, n, st.wantLogins)
		}
	}
}
