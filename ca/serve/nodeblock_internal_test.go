package serve

import (
	"log/slog"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/keymgrprom"
	"github.com/prometheus/client_golang/prometheus"
)

// TestNodeBlocksFollowTheState: the server's node blocks are those of the
// CA state the follower last put in service, and a block taken back
// there is gone.
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
	f.OnChange(st)
	if b, blocked := be.NodeBlocked("node-a"); !blocked || !b.At.Equal(at) || b.By != "alice" {
		t.Fatalf("node-a: %+v %v, want alice's block", b, blocked)
	}
	if _, blocked := be.NodeBlocked("node-b"); blocked {
		t.Fatal("node-b blocked")
	}
	next := st.Clone()
	next.Blocked = nil
	f.OnChange(next)
	if _, blocked := be.NodeBlocked("node-a"); blocked {
		t.Fatal("node-a still blocked once the state took the block back")
	}
}
