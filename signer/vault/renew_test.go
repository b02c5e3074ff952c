package vault_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshca/meshca/signer/vault"
)

// TestRenewalFailuresPaced: a token whose renewals Vault refuses (past
// its max TTL, or Vault failing) is renewed at most about once a second
// until the signer gives it up and logs in again. Vault's LifetimeWatcher
// alone retries without a pause once its back-off would outlast the
// lease (hashicorp/vault#28611): thousands of calls a second.
func TestRenewalFailuresPaced(t *testing.T) {
	const run = 3 * time.Second
	f := newFakeVault(t, func(string) bool { return false })
	f.tokens = fakeTokens{lease: 3, renewable: true, failRenewals: true}
	s := f.newSigner(t, vault.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	time.Sleep(run)
	cancel()
	<-done
	logins, _ := f.counts()
	// A renewal a second, one more at once after each login, and one
	// under way when Run ended.
	most := int(run/time.Second) + 1 + logins + 1
	n := f.renewals()
	t.Logf("%d renewals refused in %v, %d logins", n, run, logins)
	if n > most {
		t.Fatalf("%d renewals refused in %v (%d logins), want %d at most: the signer retries a failing renewal without a pause", n, run, logins, most)
	}
	if logins < 1 {
		t.Fatal("the signer never logged in")
	}
}

// TestReloginBeforeMaxTTL: when Vault renews a token no further (its max
// TTL is near), the signer logs in again while the token still works, and
// replaces it only then: it never holds no token, so requests are not kept
// waiting and the observer never hears it logged out.
func TestReloginBeforeMaxTTL(t *testing.T) {
	f := newFakeVault(t, func(string) bool { return false })
	// Renewed for a second only: the watcher gives the token up at once.
	f.tokens = fakeTokens{lease: 3, renewable: true, renewLease: 1}
	rec := &loginRecorder{}
	s := f.newSigner(t, vault.Config{Observer: rec})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for logins, _ := f.counts(); logins < 3 && time.Now().Before(deadline); logins, _ = f.counts() {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if logins, _ := f.counts(); logins < 3 {
		t.Fatalf("%d logins in 10s, want 3", logins)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, e := range rec.events {
		if !e.in {
			t.Fatalf("event %d of %v: logged out; want a login before the renewed token is given up", i, rec.events)
		}
	}
}
