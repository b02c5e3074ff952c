package serve

import (
	"log/slog"
	"math/big"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/keymgrprom"
	"github.com/prometheus/client_golang/prometheus"
)

// TestNodeBlocksFollowTheState: the server's node blocks and revoked
// certificates are those of the CA state the follower last put in
// service, and what is taken back there is gone.
func TestNodeBlocksFollowTheState(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	be := &backend{}
	f := be.follower(nil, nil, keymgrprom.New(prometheus.NewRegistry()), slog.New(slog.DiscardHandler), nil)
	if _, blocked := be.NodeBlocked("node-a"); blocked {
		t.Fatal("a block before any state")
	}
	st := &keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{{Phase: keymgr.PhaseActive, Root: root.Cert, Cert: root.Cert, Key: root.Key}}}
	at := time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC)
	st.Blocked = []keymgr.NodeBlock{{Node: "node-a", At: at, By: "alice"}}
	st.Revocations = []keymgr.Revocation{
		{Serial: big.NewInt(0x9c1e), Issuer: "ab", Reason: 1, RevokedAt: at, NotAfter: at.Add(time.Hour)},
		{Serial: big.NewInt(0xbee5), Reason: 1, RevokedAt: at, NotAfter: at.Add(time.Hour)},
	}
	f.OnChange(st)
	for _, tt := range []struct {
		serial int64
		issuer string
		want   bool
	}{{0x9c1e, "ab", true}, {0x9c1e, "cd", false}, {0xbee5, "cd", true}, {0x1, "ab", false}} {
		if got := be.Revoked(big.NewInt(tt.serial), tt.issuer); got != tt.want {
			t.Errorf("Revoked(%x, %s) = %v, want %v", tt.serial, tt.issuer, got, tt.want)
		}
	}
	if b, blocked := be.NodeBlocked("node-a"); !blocked || !b.At.Equal(at) || b.By != "alice" {
		t.Fatalf("node-a: %+v %v, want alice's block", b, blocked)
	}
	if _, blocked := be.NodeBlocked("node-b"); blocked {
		t.Fatal("node-b blocked")
	}
	next := st.Clone()
	next.Blocked, next.Revocations = nil, nil
	f.OnChange(next)
	if _, blocked := be.NodeBlocked("node-a"); blocked || be.Revoked(big.NewInt(0x9c1e), "ab") {
		t.Fatal("node-a still blocked, or 9c1e revoked, once the state took them back")
	}
}
