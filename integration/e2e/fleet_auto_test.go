package e2e

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/secretstore"
)

// An automatic rotation takes three looks of the server's rotator
// (prepare, activate, retire), --auto-rotate-interval apart, the first one
// that long after the rotator starts. With leaves of fleetLeafTTL,
// activation is due 5.5 s + fleetMargin after prepare, retirement 15.5 s
// + the follow interval + fleetMargin after activation: each at the next
// look. The
// fleets are the CLI-driven tests' (fleetSize workloads).

// autoInterval is how often the servers' automatic rotation looks
// (--auto-rotate-interval): a few looks take the fleet through a
// rotation within seconds rather than minutes.
const autoInterval = 2 * time.Second

// autoSettle bounds the whole rotation, from the fleet's first
// handshakes: three looks and one more (a new leader looks first an
// interval after it takes the Lease), the old leaves' expiry, the fleet's
// renewals.
const autoSettle = 4*autoInterval + 30*time.Second + fleetMargin

// autoFlags make a server rotate its generated root by itself as early as
// it may: with roots of 5m (backdated 2m), 90% of the lifetime is left
// already when a root is generated, so its successor is prepared at the
// rotator's first look; activation is due half a leaf's life plus
// fleetMargin later, retirement fleetMargin after the old leaves have
// expired.
// --root-lifetime must exceed --max-ttl, and cover the test.
func autoFlags() []string {
	return []string{"--auto-rotate", "--auto-rotate-interval", autoInterval.String(), "--root-lifetime", "5m", "--auto-rotate-prepare-at", "0.9",
		"--rotation-margin", fleetMargin.String(), "--max-ttl", "1m", "--default-ttl", "1m", "--backdate", fleetBackdate.String()}
}

// TestRotationFleetAutoRotation: the fleet's handshakes survive a
// rotation the server takes on its own, with no CLI.
func TestRotationFleetAutoRotation(t *testing.T) {
	t.Parallel()
	var servers []*harness.Meshca
	final := fleetRun{
		settle: autoSettle, auto: true,
		start: func(t *testing.T) fleetCA {
			s := startServer(t, autoFlags()...)
			servers = []*harness.Meshca{s.Meshca}
			return fleetCA{addrs: []string{s.Addr}, store: dirstore.Store{Dir: s.stateDir}}
		},
	}.run(t)
	checkAutoSteps(t, final, servers)
}

// TestRotationFleetTwoReplicas: two servers on one state Secret, each
// serving half the fleet, rotate on their own, the rotator elected on
// the Lease meshca-root-rotator: the handshakes survive, and each step is
// taken once, by one replica.
func TestRotationFleetTwoReplicas(t *testing.T) {
	t.Parallel()
	var servers []*harness.Meshca
	final := fleetRun{
		settle: autoSettle, auto: true,
		start: func(t *testing.T) fleetCA {
			ns := cluster.Namespace(t, "fleet-replicas")
			ca := fleetCA{store: &secretstore.Store{Client: cluster.Client, Namespace: ns, Name: "meshca-ca"}}
			for range 2 {
				m := harness.StartMeshca(t, bin, append([]string{"--state-secret", ns + "/meshca-ca", "--kubeconfig", cluster.Kubeconfig}, autoFlags()...)...)
				ca.addrs = append(ca.addrs, m.Addr)
				servers = append(servers, m)
			}
			return ca
		},
	}.run(t)
	checkAutoSteps(t, final, servers)
	for i, m := range servers {
		n := strings.Count(m.Logs(), `"msg":"certificate request"`)
		harness.Report(t, "server %d answered %d CSR requests, led the rotator: %v", i, n, led(m, rotatorLease))
		if n == 0 {
			t.Errorf("server %d answered no CSR request: the fleet was not split across the replicas", i)
		}
	}
}

// rotatorLease is serve.RotatorLease (ca/serve is not imported here: its
// dependencies are not the integration module's).
const rotatorLease = "meshca-root-rotator"

// autoStep is an automatic rotation step as a server logs it.
type autoStep struct{ verb, authority string }

// checkAutoSteps checks that the servers, together, logged each
// automatic step the final state's history shows exactly once, and no
// other: the successors' prepare and activate, the retirements. A step
// is saved before it is logged, so the logs get a moment to catch up.
func checkAutoSteps(t *testing.T, st *keymgr.State, servers []*harness.Meshca) {
	t.Helper()
	type timed struct {
		at   time.Time
		step autoStep
	}
	var want []timed
	verbs := map[keymgr.Phase]string{keymgr.PhasePrepared: keymgr.VerbPrepare, keymgr.PhaseActive: keymgr.VerbActivate, keymgr.PhaseRetired: keymgr.VerbRetire}
	for _, a := range st.Authorities {
		for _, tr := range a.History {
			if verb, ok := verbs[tr.To]; ok && strings.Contains(tr.Reason, "automatic rotation") {
				want = append(want, timed{tr.At, autoStep{verb, a.ID()}})
			}
		}
	}
	slices.SortFunc(want, func(a, b timed) int { return a.at.Compare(b.at) })
	var logged map[autoStep][]int
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		logged = stepsLogged(servers)
		if len(logged) >= len(want) || time.Now().After(deadline) {
			break
		}
	}
	for _, w := range want {
		s := w.step
		if by := logged[s]; len(by) != 1 {
			t.Errorf("automatic step %s %.16s logged by the servers %v, want exactly one", s.verb, s.authority, by)
		} else {
			t.Logf("automatic step %s %.16s taken by server %d", s.verb, s.authority, by[0])
		}
		delete(logged, s)
	}
	for s, by := range logged {
		t.Errorf("automatic step %s %.16s logged by the servers %v is not in the state's history", s.verb, s.authority, by)
	}
}

// stepsLogged is, for every automatic rotation step the servers logged,
// the indexes of the servers that logged it.
func stepsLogged(servers []*harness.Meshca) map[autoStep][]int {
	logged := map[autoStep][]int{}
	for i, m := range servers {
		for line := range strings.Lines(m.Logs()) {
			var e struct{ Msg, Verb, Authority string }
			if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "automatic rotation step" {
				k := autoStep{e.Verb, e.Authority}
				logged[k] = append(logged[k], i)
			}
		}
	}
	return logged
}

// led reports whether m logged that it leads the Lease name.
func led(m *harness.Meshca, name string) bool {
	return slices.ContainsFunc(strings.Split(m.Logs(), "\n"), func(line string) bool {
		return strings.Contains(line, `"msg":"leading"`) && strings.Contains(line, "/"+name+`"`)
	})
}
