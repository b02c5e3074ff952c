package vault_test

import (
	"context"
	"sync"
	"testing"

	"github.com/meshca/meshca/signer/vault"
)

// TestSignKeepsConnections: concurrent signs over HTTP/1.1 reuse their
// connections. The Vault client's default pool keeps GOMAXPROCS+1 idle,
// so a busy CA used to open a connection for about every request.
func TestSignKeepsConnections(t *testing.T) {
	f := newFakeVault(t, func(string) bool { return false })
	s := f.newSigner(t, vault.Config{})
	req := newRequest(t, workload)
	const streams, rounds = 16, 10
	for range rounds {
		var wg sync.WaitGroup
		for range streams {
			wg.Go(func() {
				if _, err := s.Sign(context.Background(), req); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	if n := f.opened.Load(); n > 2*streams {
		t.Errorf("%d connections opened for %d rounds of %d requests at once, want at most %d", n, rounds, streams, 2*streams)
	}
}
