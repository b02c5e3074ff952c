package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// TestRevokeRacesActivate: `meshca revoke` and `meshca root activate`,
// the real binaries, started together on the CA state of a running
// meshca serve --crl, round after round: both land (one compare-and-swap
// write retried on the other's), so every revocation and every
// activation is in the final state.
func TestRevokeRacesActivate(t *testing.T) {
	const rounds = 5
	file := t.TempDir() + "/audit.log"
	s := startServer(t, "--crl", "--audit-log-file", file)
	w := cluster.NewWorkload(t, cluster.Namespace(t, "revoke-race"), "web", "node-a")
	var serials []string
	for range rounds {
		svid, err := s.client(t, w.Token).Fetch(context.Background(), workloadID(w), caclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		serials = append(serials, svid.Chain[0].SerialNumber.Text(16))
	}
	readAudit(t, file, rounds+1)
	st := "--state-dir=" + s.stateDir
	store := dirstore.Store{Dir: s.stateDir}
	overlapped := 0
	for i, serial := range serials {
		if out, code := rootStep(t, "prepare", st, "--reason", "e2e race"); code != 0 {
			t.Fatalf("prepare %d: exit %d\n%s", i, code, out)
		}
		var prepared string
		for _, a := range loadState(t, store).Authorities {
			if a.Phase == keymgr.PhasePrepared {
				prepared = a.ID()
			}
		}
		var wg sync.WaitGroup
		var revokeOut, activateOut string
		var revokeCode, activateCode int
		var revokeAt, activateAt [2]time.Time
		wg.Go(func() {
			revokeAt[0] = time.Now()
			revokeOut, revokeCode = revokeCmd(t, st, "--serial", serial, "--reason", "keyCompromise", "--audit-log", file)
			revokeAt[1] = time.Now()
		})
		wg.Go(func() {
			activateAt[0] = time.Now()
			activateOut, activateCode = rootStep(t, "activate", prepared[:16], st, "--force", "--reason", fmt.Sprintf("e2e race %d", i))
			activateAt[1] = time.Now()
		})
		wg.Wait()
		if revokeAt[0].Before(activateAt[1]) && activateAt[0].Before(revokeAt[1]) {
			overlapped++
		}
		if revokeCode != 0 || activateCode != 0 {
			t.Fatalf("round %d: revoke exit %d, activate exit %d\n%s\n%s", i, revokeCode, activateCode, revokeOut, activateOut)
		}
		final := loadState(t, store)
		if a := final.Active(); a == nil || a.ID() != prepared {
			t.Fatalf("round %d: the activation was lost", i)
		}
		for _, want := range serials[:i+1] {
			found := false
			for _, r := range final.Revocations {
				found = found || r.Serial.Text(16) == want
			}
			if !found {
				t.Fatalf("round %d: the revocation of %s was lost", i, want)
			}
		}
	}
	harness.Report(t, "%d rounds of meshca revoke racing meshca root activate (the two processes overlapped in %d): every revocation and activation landed", rounds, overlapped)
}
