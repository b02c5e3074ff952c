package vaultauth_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/vaultauth"
)

// kubernetesLogins stands in for Vault's Kubernetes auth method: it
// records the mount and the service-account token of every login.
type kubernetesLogins struct {
	mu     sync.Mutex
	mounts []string
	jwts   []string
}

func (k *kubernetesLogins) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mount, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/v1/auth/"), "/login")
	var body struct {
		JWT  string `json:"jwt"`
		Role string `json:"role"`
	}
	if !ok || json.NewDecoder(r.Body).Decode(&body) != nil || body.Role != "meshca" {
		replyJSON(w, http.StatusBadRequest, map[string]any{"errors": []string{"not a Kubernetes login"}})
		return
	}
	k.mu.Lock()
	k.mounts = append(k.mounts, mount)
	k.jwts = append(k.jwts, body.JWT)
	k.mu.Unlock()
	replyJSON(w, http.StatusOK, map[string]any{"auth": map[string]any{"client_token": "tok", "lease_duration": 60, "renewable": true}})
}

// TestKubernetesLoginRereadsToken: every Kubernetes login sends the
// service-account token the file holds then, as the kubelet rotates it;
// a token file that cannot be read fails at start.
func TestKubernetesLoginRereadsToken(t *testing.T) {
	for _, tc := range []struct{ name, mount, wantMount string }{
		{name: "default mount", wantMount: "kubernetes"},
		{name: "own mount", mount: "k8s-east", wantMount: "k8s-east"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logins := &kubernetesLogins{}
			srv := httptest.NewServer(logins)
			defer srv.Close()
			cfg := api.DefaultConfig()
			cfg.Address = srv.URL
			client, err := api.NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "token")
			write := func(jwt string) {
				t.Helper()
				if err := os.WriteFile(path, []byte(jwt), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			write("jwt-1")
			auth, err := vaultauth.Kubernetes(tc.mount, "meshca", path)
			if err != nil {
				t.Fatal(err)
			}
			for _, jwt := range []string{"jwt-1", "jwt-2", "jwt-3"} {
				write(jwt) // the kubelet's rotation
				if _, err := auth.Login(context.Background(), client); err != nil {
					t.Fatalf("login with %s: %v", jwt, err)
				}
			}
			logins.mu.Lock()
			defer logins.mu.Unlock()
			if got := strings.Join(logins.jwts, ","); got != "jwt-1,jwt-2,jwt-3" {
				t.Errorf("logins sent the tokens %s, want jwt-1,jwt-2,jwt-3 (the file's at each login)", got)
			}
			for _, m := range logins.mounts {
				if m != tc.wantMount {
					t.Errorf("login to mount %q, want %q", m, tc.wantMount)
				}
			}
		})
	}
	if _, err := vaultauth.Kubernetes("", "meshca", filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing token file: %v, want an error naming it", err)
	}
}

// replyJSON answers as Vault does, with v as JSON.
func replyJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
