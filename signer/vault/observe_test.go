package vault_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/signer/vault"
	"github.com/meshca/meshca/vaultauth"
)

// loginEvent is one call of a vaultauth.Observer: in with the token's
// expiry, or out.
type loginEvent struct {
	in      bool
	expires time.Time
}

type loginRecorder struct {
	mu     sync.Mutex
	events []loginEvent
}

func (r *loginRecorder) LoggedIn(expires time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, loginEvent{in: true, expires: expires})
}

func (r *loginRecorder) LoggedOut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, loginEvent{})
}

// wait returns the first n events, or all there are after 10 s.
func (r *loginRecorder) wait(n int) []loginEvent {
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		got := slices.Clone(r.events)
		r.mu.Unlock()
		if len(got) >= n {
			return got[:n]
		}
		if time.Now().After(deadline) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestObserver: the observer hears every change of the login's state in
// order: a login with its token's expiry on the signer's clock, each
// renewal with the new one, no expiry for a token that lives forever,
// logged out when a login fails or a token is given up to be replaced.
func TestObserver(t *testing.T) {
	clock := newFakeClock()
	at := func(secs int) loginEvent {
		return loginEvent{in: true, expires: clock.Now().Add(time.Duration(secs) * time.Second)}
	}
	out := loginEvent{}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		tokens fakeTokens
		auth   api.AuthMethod
		want   []loginEvent
	}{
		{name: "renewed", tokens: fakeTokens{renewable: true, renewLease: 7200}, want: []loginEvent{at(3600), at(7200)}},
		{name: "token file that never expires", tokens: fakeTokens{lease: -1}, auth: vaultauth.TokenFile{Path: tokenFile},
			want: []loginEvent{{in: true}}},
		// Vault rounds the TTL of a token with less than a second left
		// down to 0, which would read as "never expires".
		{name: "token file about to expire", tokens: fakeTokens{lease: -1, expiring: true}, auth: vaultauth.TokenFile{Path: tokenFile},
			want: []loginEvent{at(1)}},
		{name: "login fails", tokens: fakeTokens{failLogins: true}, want: []loginEvent{out}},
		// Not renewable: Run gives the token up at two thirds of its
		// life (2 s) and logs in again.
		{name: "replaced before expiry", tokens: fakeTokens{lease: 3}, want: []loginEvent{at(3), out, at(3)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVault(t, func(string) bool { return false })
			f.tokens = tt.tokens
			rec := &loginRecorder{}
			s := f.newSigner(t, vault.Config{Auth: tt.auth, Now: clock.Now, Observer: rec})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = s.Run(ctx); close(done) }()
			got := rec.wait(len(tt.want))
			cancel()
			<-done
			if !slices.Equal(got, tt.want) {
				t.Fatalf("observer heard %v, want %v", got, tt.want)
			}
		})
	}
}
