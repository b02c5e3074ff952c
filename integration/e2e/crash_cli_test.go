package e2e

import (
	"bytes"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// rotation is the order of the steps a walk takes, round and round.
var rotation = []string{"prepare", "activate", "retire"}

// stepArgs are the arguments of `meshca root verb` on s: quick keys, and
// forced guards so that a walk need not wait for them.
func stepArgs(s *crashStore, verb string) []string {
	args := []string{"root", verb}
	if verb == "prepare" {
		args = append(args, "--key-type", string(certs.KeyECP256), "--lifetime", "24h", "--reason", "crash test")
	} else {
		args = append(args, "--force", "--reason", "crash test")
	}
	return append(args, s.flags...)
}

// runStep takes verb on s, not killed: it must succeed and be exactly
// that step, and leave a directory clean of what earlier kills left.
func (s *crashStore) runStep(t *testing.T, verb string) {
	t.Helper()
	s.timedStep(t, verb, false)
}

// timedStep is runStep, and returns how long the process ran and, with
// watch, how long it ran from when it started to write (crashStore.writing).
func (s *crashStore) timedStep(t *testing.T, verb string, watch bool) (run, writing time.Duration) {
	t.Helper()
	prev := s.load(t)
	cmd := exec.Command(bin, stepArgs(s, verb)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var from time.Time
	if watch {
		waitFor(cmd.Process.Pid, s.writing())
		from = time.Now()
	}
	err := cmd.Wait()
	run = time.Since(start)
	if watch {
		writing = time.Since(from)
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", verb, err, out.String())
	}
	next := s.load(t)
	want := verb
	if prev == nil {
		want = "bootstrap"
	}
	if got, err := stepBetween(prev, next); err != nil || got != want {
		t.Fatalf("%s: the state took step %q (%v), want %s", verb, got, err, want)
	}
	if err := checkState(next); err != nil {
		t.Fatalf("%s: %v", verb, err)
	}
	if s.dir != "" {
		if l := lookDir(t, s.dir, next); !l.clean() {
			t.Fatalf("%s succeeded but the directory is not clean: %+v", verb, l)
		}
	}
	return run, writing
}

// crashStep runs verb on s, kills it delay after its start (or, with
// fromWriting, after it started to write: crashStore.writing), and checks
// what it left: the state loads in-process and through `meshca root
// status`, keeps every invariant, and is the state before or the one the
// step makes, never anything else; a directory's lock is free and its
// files safe. When the step did not land, it then takes it, unkilled.
func (s *crashStore) crashStep(t *testing.T, verb string, delay time.Duration, fromWriting bool, where tally) {
	t.Helper()
	defer func() {
		if t.Failed() {
			from := "it started"
			if fromWriting {
				from = "it started to write"
			}
			t.Logf("(checking a %s killed %v after %s)", verb, delay, from)
		}
	}()
	prev := s.load(t)
	want := verb
	if prev == nil {
		want = "bootstrap"
	}
	in, held := s.writing(), false
	var from func(pid int) bool
	if fromWriting {
		from = in
	}
	exited, out := killRun(t, delay, from, func(pid int) { held = in(pid) }, stepArgs(s, verb)...)
	next := s.settled(t)
	got, err := stepBetween(prev, next)
	switch {
	case err != nil:
		t.Fatal(err)
	case got != "" && got != want:
		t.Fatalf("the state took step %s", got)
	case exited && got == "":
		t.Fatalf("it finished on its own without taking the step\n%s", out)
	}
	if next != nil {
		if err := checkState(next); err != nil {
			t.Fatal(err)
		}
	}
	s.checkStatus(t, next)
	if s.dir != "" {
		lookDir(t, s.dir, next).tallyInto(where)
		checkUnlocked(t, s.dir)
	}
	where[landed(s.kind, exited, held, got != "")]++
	if got == "" {
		s.runStep(t, verb)
	}
}

// landed names where in its run a kill stopped a step.
func landed(kind string, exited, held, stepped bool) string {
	switch {
	case exited:
		return "finished before the kill"
	case kind == "secret" && stepped:
		return "killed after the update landed"
	case kind == "secret" && held:
		return "killed connected to the apiserver, before the update landed"
	case kind == "secret":
		return "killed before it connected"
	case held && stepped:
		return "killed holding the lock, after the commit"
	case held:
		return "killed holding the lock, before the commit"
	case stepped:
		return "killed after the save"
	}
	return "killed before the lock"
}

// walk is a rotation walk on a store of kind, renewed every
// walkRotations rotations so that retired authorities do not pile up
// and slow every load.
type walk struct {
	kind, ns  string
	store     *crashStore
	stores    int
	rotations int
}

const walkRotations = 8

// rotate takes one full rotation, each step killed as kill says.
func (w *walk) rotate(t *testing.T, kill func(s *crashStore, verb string)) {
	t.Helper()
	if w.store == nil || w.rotations%walkRotations == 0 {
		w.stores++
		w.store = openCrashStore(t, w.kind, w.ns, fmt.Sprintf("walk-%d", w.stores))
		w.store.runStep(t, "prepare")
	}
	for _, verb := range rotation {
		kill(w.store, verb)
	}
	w.rotations++
}

// TestCrashCLI kills `meshca root prepare|activate|retire` with SIGKILL
// on a state directory and on a Secret of the real apiserver, at points
// swept over the run of each step (measured first): the bootstrap
// (prepare on an empty store), each on a fresh store; on a directory,
// the migration of the single-root layout (prepare on a directory
// LoadOrCreate wrote: the first save migrates it); then, in walks of
// full rotations, every step of a rotation killed at one point: evenly
// over the whole run, more densely over its end, at random, and evenly
// over the part where it writes, counted from when it starts to write
// (a directory: /proc/locks shows it holding the directory's lock; a
// Secret: /proc shows it connected to the apiserver). After every kill
// the state loads in-process and through `meshca root status`, keeps
// every invariant, and is the state before or after the step, never half
// of it; a directory's files are safe and its lock free. Then the step,
// if it did not land, is taken again and must succeed.
func TestCrashCLI(t *testing.T) {
	for _, tt := range []struct {
		kind                                    string
		boot, migrate, even, end, rand, writing int
	}{
		{"dir", 4, 4, 6, 3, 2, 8},
		{"secret", 2, 0, 5, 2, 1, 5},
	} {
		t.Run(tt.kind, func(t *testing.T) {
			start := time.Now()
			ns := ""
			if tt.kind == "secret" {
				ns = cluster.Namespace(t, "crash-cli")
			}
			w := &walk{kind: tt.kind, ns: ns}
			runs, writes := map[string][]time.Duration{}, map[string][]time.Duration{}
			for i := range 4 {
				w.rotate(t, func(s *crashStore, verb string) {
					run, writing := s.timedStep(t, verb, i%2 == 1)
					if i%2 == 0 {
						runs[verb] = append(runs[verb], run)
					} else {
						writes[verb] = append(writes[verb], writing)
					}
				})
			}
			took, writing := map[string]time.Duration{}, map[string]time.Duration{}
			for _, verb := range rotation {
				took[verb], writing[verb] = median(runs[verb]), median(writes[verb])
				t.Logf("%s runs for %v, the last %v of it writing", verb, took[verb], writing[verb])
			}
			at := func(f float64, d time.Duration) time.Duration { return time.Duration(f * float64(d)) }
			where, kills := tally{}, 0
			boot := append(spread(tt.boot, 0, 1), randomPoints(t, 1)...)
			for i, f := range boot {
				s := openCrashStore(t, tt.kind, ns, fmt.Sprintf("boot-%d", i))
				s.crashStep(t, "prepare", at(f, took["prepare"]), false, where)
				kills++
			}
			for i, f := range spread(tt.migrate, 0, 1) {
				s := openCrashStore(t, tt.kind, ns, fmt.Sprintf("single-root-%d", i))
				if _, _, err := dirstore.LoadOrCreate(s.dir, dirstore.StateOptions{KeyType: certs.KeyECP256, Organization: "cluster.local", RootTTL: 24 * time.Hour}); err != nil {
					t.Fatal(err)
				}
				s.crashStep(t, "prepare", at(f, took["prepare"]), false, where)
				kills++
			}
			points := append(append(spread(tt.even, 0, 1), spread(tt.end, 0.6, 1)...), randomPoints(t, tt.rand)...)
			for _, f := range points {
				w.rotate(t, func(s *crashStore, verb string) {
					s.crashStep(t, verb, at(f, took[verb]), false, where)
					kills++
				})
			}
			for _, f := range spread(tt.writing, 0, 1) {
				w.rotate(t, func(s *crashStore, verb string) {
					s.crashStep(t, verb, at(f, writing[verb]), true, where)
					kills++
				})
			}
			harness.Report(t, "%d kills: %d bootstraps, %d migrations, then %d points over the run and %d over the writing of each step, in %d rotations on %d stores, in %v; %v",
				kills, len(boot), tt.migrate, len(points), tt.writing, w.rotations, w.stores, time.Since(start).Round(time.Millisecond), where)
		})
	}
}
