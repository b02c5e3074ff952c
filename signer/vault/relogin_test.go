package vault_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/vault"
	"github.com/meshca/meshca/vaultauth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

var workload = spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")

// errorLog collects what the signer reports through OnLoginError.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) report(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

// assertNoToken fails if any reported error names a token.
func (l *errorLog) assertNoToken(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, err := range l.errs {
		if strings.Contains(err.Error(), "tok-") {
			t.Errorf("reported error names a token: %v", err)
		}
	}
}

// sequentially and concurrently send n requests and return their errors.
func sequentially(n int, sign func() error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = sign()
	}
	return errs
}

func concurrently(n int, sign func() error) []error {
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = sign()
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

// TestRelogin403Backoff: a Vault that refuses every signature (a role or
// policy misconfiguration) gets one re-login per backoff interval however
// many requests arrive, sequentially or at once; the requests in between
// fail as refused without a login, and every replaced token is revoked
// exactly once.
func TestRelogin403Backoff(t *testing.T) {
	const backoff = time.Minute
	for _, tc := range []struct {
		name string
		send func(n int, sign func() error) []error
	}{
		{"sequential", sequentially},
		{"concurrent", concurrently},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeVault(t, func(string) bool { return true })
			clock := newFakeClock()
			var log errorLog
			s := f.newSigner(t, vault.Config{ReloginBackoff: backoff, Now: clock.Now, OnLoginError: log.report})
			req := newRequest(t, workload)
			send := func(phase string, wantLogins int, wantRevoked ...string) {
				t.Helper()
				for i, err := range tc.send(50, func() error {
					_, err := s.Sign(context.Background(), req)
					return err
				}) {
					if signer.KindOf(err) != signer.KindRefused {
						t.Fatalf("%s: request %d: got %v (kind %s), want kind %s", phase, i, err, signer.KindOf(err), signer.KindRefused)
					}
					if strings.Contains(err.Error(), "tok-") {
						t.Fatalf("%s: error names a token: %v", phase, err)
					}
				}
				if logins, _ := f.counts(); logins != wantLogins {
					t.Fatalf("%s: %d logins, want %d", phase, logins, wantLogins)
				}
				if got := f.waitRevoked(t, len(wantRevoked)); !slices.Equal(got, wantRevoked) {
					t.Fatalf("%s: revoked %q, want %q", phase, got, wantRevoked)
				}
			}

			// The first login, then one re-login that replaces (and
			// revokes) tok-1; tok-2 is refused too.
			send("first interval", 2, "tok-1")
			clock.Advance(backoff - time.Second)
			send("end of the first interval", 2, "tok-1")
			clock.Advance(time.Second)
			send("second interval", 3, "tok-1", "tok-2")
			log.assertNoToken(t)
		})
	}
}

// TestRelogin403Recovers: a revoked token is replaced by a fresh login and
// the request succeeds with it; a second revocation within the backoff
// interval is refused without a login, and after it the signer recovers.
func TestRelogin403Recovers(t *testing.T) {
	const backoff = time.Minute
	var (
		mu     sync.Mutex
		denied = map[string]bool{"tok-1": true}
	)
	f := newFakeVault(t, func(token string) bool {
		mu.Lock()
		defer mu.Unlock()
		return denied[token]
	})
	clock := newFakeClock()
	var log errorLog
	s := f.newSigner(t, vault.Config{ReloginBackoff: backoff, Now: clock.Now, OnLoginError: log.report})
	ctx := context.Background()
	steps := []struct {
		name        string
		deny        string
		advance     time.Duration
		wantKind    signer.Kind // "" for success
		wantLogins  int
		wantRevoked []string
	}{
		{name: "tok-1 revoked: fresh login", wantLogins: 2, wantRevoked: []string{"tok-1"}},
		{name: "tok-2 works", wantLogins: 2, wantRevoked: []string{"tok-1"}},
		{name: "tok-2 revoked within the interval", deny: "tok-2", advance: backoff / 2, wantKind: signer.KindRefused, wantLogins: 2, wantRevoked: []string{"tok-1"}},
		{name: "after the interval: fresh login", advance: backoff / 2, wantLogins: 3, wantRevoked: []string{"tok-1", "tok-2"}},
		{name: "tok-3 works", wantLogins: 3, wantRevoked: []string{"tok-1", "tok-2"}},
	}
	for _, st := range steps {
		mu.Lock()
		if st.deny != "" {
			denied[st.deny] = true
		}
		mu.Unlock()
		clock.Advance(st.advance)
		_, err := s.Sign(ctx, newRequest(t, workload))
		switch {
		case st.wantKind == "" && err != nil:
			t.Fatalf("%s: %v", st.name, err)
		case st.wantKind != "" && signer.KindOf(err) != st.wantKind:
			t.Fatalf("%s: got %v, want kind %s", st.name, err, st.wantKind)
		}
		if logins, _ := f.counts(); logins != st.wantLogins {
			t.Fatalf("%s: %d logins, want %d", st.name, logins, st.wantLogins)
		}
		if got := f.waitRevoked(t, len(st.wantRevoked)); !slices.Equal(got, st.wantRevoked) {
			t.Fatalf("%s: revoked %q, want %q", st.name, got, st.wantRevoked)
		}
	}
	log.assertNoToken(t)
}

// TestRelogin403KeepsTokenFile: a token read from a file belongs to whoever
// wrote it (Vault Agent, an operator), so a re-login re-reads the file but
// never revokes the token it replaces.
func TestRelogin403KeepsTokenFile(t *testing.T) {
	f := newFakeVault(t, func(string) bool { return true })
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := f.newSigner(t, vault.Config{Auth: vaultauth.TokenFile{Path: path}, Now: newFakeClock().Now})
	for i := range 3 {
		if _, err := s.Sign(context.Background(), newRequest(t, workload)); signer.KindOf(err) != signer.KindRefused {
			t.Fatalf("request %d: got %v, want kind %s", i, err, signer.KindRefused)
		}
	}
	time.Sleep(100 * time.Millisecond) // a revocation would follow the re-login
	logins, revoked := f.counts()
	if logins != 2 || len(revoked) != 0 {
		t.Fatalf("%d logins and revoked %q, want 2 logins and no revocation", logins, revoked)
	}
}
