package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/hostile"
	"github.com/meshca/meshca/integration/load"
)

// soakAdminSlots is how many idle admin connections the attacker keeps
// to each replica: what RLIMIT_NOFILE's 20,000 leaves beside the gRPC
// attacks' 4 × 80 connections from each of 16 addresses to 2 replicas.
const soakAdminSlots = 2048

// soakAttack is a running cmd/attack process: a hostile Pod, a process
// of its own, its CPU its own.
type soakAttack struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	last   hostile.Line
	stderr bytes.Buffer
	done   chan struct{}
}

// soakAttacker is the cmd/attack binary, the attacks it runs and its nice
// value (soakAttackerNice).
type soakAttacker struct {
	bin, kinds string
	nice       int
}

// start runs the attacks at once against every replica, from sources
// consecutive addresses from from.
func (at soakAttacker) start(t *testing.T, replicas []*harness.Meshca, from string, sources int) *soakAttack {
	t.Helper()
	var grpcs, admins []string
	for _, m := range replicas {
		grpcs, admins = append(grpcs, m.Addr), append(admins, m.AdminAddr)
	}
	a := &soakAttack{done: make(chan struct{})}
	// nice before exec: every thread of the attacker inherits it.
	a.cmd = exec.Command("nice", "-n", fmt.Sprint(at.nice), at.bin, "-kinds", at.kinds, "-grpc", strings.Join(grpcs, ","),
		"-admin", strings.Join(admins, ","), "-from", from, "-sources", fmt.Sprint(sources), "-admin-slots", fmt.Sprint(soakAdminSlots))
	a.cmd.Stderr = &a.stderr
	out, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var l hostile.Line
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				a.mu.Lock()
				a.last = l
				a.mu.Unlock()
			}
		}
		_ = a.cmd.Wait()
	}()
	t.Cleanup(func() { a.stop() })
	return a
}

// exited reports whether the attacker has stopped by itself: a failure
// of the test's, not of meshca's.
func (a *soakAttack) exited() error {
	select {
	case <-a.done:
		return fmt.Errorf("the attacker exited: %v\n%s", a.cmd.ProcessState, a.stderr.String())
	default:
		return nil
	}
}

// stop ends the attack (SIGTERM: the attacker closes every connection)
// and returns its last figures and the CPU it used.
func (a *soakAttack) stop() (hostile.Line, time.Duration) {
	cpu, _ := load.ProcCPU(a.cmd.Process.Pid)
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last, cpu
}

// soakAttackSummary is one line per kind of what the attacker held and
// how the replicas ended its connections.
func soakAttackSummary(l hostile.Line) []string {
	var out []string
	for _, k := range hostile.Kinds() {
		c, ok := l.Kinds[k.String()]
		if !ok {
			continue
		}
		s := fmt.Sprintf("%s: held at most %d connections", k, c.HeldMax)
		if c.Streams > 0 {
			s += fmt.Sprintf(" and %d streams (%d opened, %d ended by the server)", c.StreamsHeldMax, c.Streams, c.StreamsClosed)
		}
		s += fmt.Sprintf("; %d dialled, %d refused, %d closed later", c.Dials, c.Refused, c.Closed)
		if c.Closed > 0 {
			s += fmt.Sprintf(" after %v on average (at most %v)", time.Duration(c.LifeMean).Round(time.Millisecond), time.Duration(c.LifeMax).Round(time.Millisecond))
		}
		if c.LastEnd != "" {
			s += fmt.Sprintf(" (last: %s)", c.LastEnd)
		}
		if c.LocalErrors > 0 {
			s += fmt.Sprintf("; %d failures of the attacker's own (last: %s)", c.LocalErrors, c.LastLocal)
		}
		out = append(out, s)
	}
	return slices.Clip(out)
}
