package e2e

import (
	"bytes"
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/secretstore"
)

// The crash tests kill meshca processes with SIGKILL at points swept
// across their run and check, after every kill, what a restarted process
// finds in the CA state: crash_cli_test.go kills `meshca root` steps,
// crash_serve_test.go kills `meshca serve`, crash_dir_test.go checks a
// state directory's files and lock; this file holds what they share: the
// two stores, the kill, and the invariants. A kill freezes the process
// first (SIGSTOP), so that the test can see where it stood (holding the
// directory's lock, connected to the apiserver) before SIGKILL lands
// exactly there.

// crashStore is a CA state the crash tests kill processes on: a state
// directory, or a Secret of the real apiserver.
type crashStore struct {
	kind  string // "dir" or "secret"
	flags []string
	store keymgr.StateStore
	dir   string // the state directory; "" for a Secret
}

// openCrashStore names a new, empty store of kind: a directory under
// t.TempDir(), or the Secret ns/name.
func openCrashStore(t *testing.T, kind, ns, name string) *crashStore {
	t.Helper()
	if kind == "dir" {
		dir := filepath.Join(t.TempDir(), name)
		return &crashStore{kind: kind, flags: []string{"--state-dir", dir}, dir: dir,
			store: &dirstore.Store{Dir: dir, LockTimeout: 5 * time.Second}}
	}
	return &crashStore{kind: kind, flags: []string{"--state-secret", ns + "/" + name, "--kubeconfig", cluster.Kubeconfig},
		store: secretstore.Store{Client: cluster.Client, Namespace: ns, Name: name}}
}

// load reads the state in-process; nil when none is stored.
func (s *crashStore) load(t *testing.T) *keymgr.State {
	t.Helper()
	return s.read(t, false)
}

// settled is load after a kill: for a Secret it waits until two reads
// 50 ms apart agree, since an update a killed client sent may still land
// after the client died.
func (s *crashStore) settled(t *testing.T) *keymgr.State {
	t.Helper()
	return s.read(t, true)
}

func (s *crashStore) read(t *testing.T, settle bool) *keymgr.State {
	t.Helper()
	ctx := context.Background()
	read := func() (*keymgr.State, keymgr.Version) {
		st, v, err := s.store.Load(ctx)
		switch {
		case errors.Is(err, keymgr.ErrNoState):
			return nil, ""
		case err != nil:
			t.Fatalf("the CA state does not load: %v", err)
		}
		return st, v
	}
	st, v := read()
	for settle && s.kind == "secret" {
		time.Sleep(50 * time.Millisecond)
		again, v2 := read()
		if v2 == v {
			break
		}
		st, v = again, v2
	}
	return st
}

// checkStatus runs `meshca root status -o json` and checks that it shows
// st (nil: no state, exit 2).
func (s *crashStore) checkStatus(t *testing.T, st *keymgr.State) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"root", "status", "-o", "json"}, s.flags...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if st == nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "no CA state stored") {
			t.Fatalf("root status without a state: %v, want exit 2 saying so\n%s%s", err, out, stderr.String())
		}
		return
	}
	if err != nil {
		t.Fatalf("root status: %v\n%s%s", err, out, stderr.String())
	}
	var v struct {
		Sequence    uint64
		Authorities []struct{ SHA256, State string }
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("root status -o json: %v\n%s", err, out)
	}
	got := []string{strconv.FormatUint(v.Sequence, 10)}
	for _, a := range v.Authorities {
		got = append(got, a.SHA256+" "+a.State)
	}
	if want := summary(st); !slices.Equal(got, want) {
		t.Fatalf("root status shows %q, the store holds %q", got, want)
	}
}

// summary is the sequence and every authority's id and phase.
func summary(st *keymgr.State) []string {
	out := []string{strconv.FormatUint(st.Sequence, 10)}
	for _, a := range st.Authorities {
		out = append(out, a.ID()+" "+string(a.Phase))
	}
	return out
}

// checkState checks the invariants every stored state keeps, whatever
// was killed and when: it validates, its active authority can sign,
// exactly one authority is active, ids are unique, every authority meshca
// holds a key for still has it and a retired one has none.
func checkState(st *keymgr.State) error {
	if err := st.Validate(); err != nil {
		return err
	}
	if _, err := keymgr.StateAuthority(st, time.Now()); err != nil {
		return err
	}
	ids, active := map[string]bool{}, 0
	for _, a := range st.Authorities {
		id := a.ID()
		switch {
		case ids[id]:
			return fmt.Errorf("authority %.16s appears twice", id)
		case a.Phase == keymgr.PhaseRetired && a.Key != nil:
			return fmt.Errorf("retired authority %.16s still has its key", id)
		case a.Phase != keymgr.PhaseRetired && !a.External && a.Key == nil:
			return fmt.Errorf("%s authority %.16s lost its key", a.Phase, id)
		case a.Phase == keymgr.PhaseActive:
			active++
		}
		ids[id] = true
	}
	if active != 1 {
		return fmt.Errorf("%d authorities are active, want 1", active)
	}
	return nil
}

var phaseRank = map[keymgr.Phase]int{keymgr.PhasePrepared: 0, keymgr.PhaseActive: 1, keymgr.PhasePrevious: 2, keymgr.PhaseRetired: 3}

// checkGrowth checks that next can follow prev, whatever happened in
// between: the sequence never goes back, and stays only if the
// authorities and their phases do; no authority is lost, reordered or
// moved back; a key is never replaced; recorded leaf horizons only grow.
func checkGrowth(prev, next *keymgr.State) error {
	if prev == nil {
		return nil
	}
	if next == nil {
		return errors.New("the state is gone")
	}
	switch {
	case next.Sequence < prev.Sequence:
		return fmt.Errorf("the bundle sequence went back from %d to %d", prev.Sequence, next.Sequence)
	case len(next.Authorities) < len(prev.Authorities):
		return fmt.Errorf("%d authorities before, %d after", len(prev.Authorities), len(next.Authorities))
	case next.Sequence == prev.Sequence && !slices.Equal(summary(prev), summary(next)):
		return fmt.Errorf("the authorities changed at sequence %d: %q, then %q", next.Sequence, summary(prev), summary(next))
	}
	for i, p := range prev.Authorities {
		n := next.Authorities[i]
		switch {
		case n.ID() != p.ID():
			return fmt.Errorf("authority %d was %.16s, is %.16s", i+1, p.ID(), n.ID())
		case phaseRank[n.Phase] < phaseRank[p.Phase]:
			return fmt.Errorf("authority %.16s went back from %s to %s", p.ID(), p.Phase, n.Phase)
		case p.Key != nil && n.Key != nil && !sameKey(p.Key, n.Key):
			return fmt.Errorf("authority %.16s has another key", p.ID())
		case n.LatestLeafNotAfter.Before(p.LatestLeafNotAfter) || n.LongestLeafTTL < p.LongestLeafTTL:
			return fmt.Errorf("authority %.16s: the recorded leaves went back", p.ID())
		}
	}
	return nil
}

func sameKey(a, b crypto.Signer) bool {
	eq, ok := a.(interface{ Equal(crypto.PrivateKey) bool })
	return ok && eq.Equal(b)
}

// stepBetween is the one rotation step that leads from prev to next: ""
// when next is prev, else "bootstrap", "prepare", "activate" or
// "retire". Anything else (two steps, a step half taken) is an error.
func stepBetween(prev, next *keymgr.State) (string, error) {
	switch {
	case prev == nil && next == nil:
		return "", nil
	case prev == nil:
		if len(next.Authorities) != 1 || next.Sequence != 1 {
			return "", fmt.Errorf("a first state of sequence %d with %d authorities, want 1 and 1", next.Sequence, len(next.Authorities))
		}
		return "bootstrap", nil
	}
	if err := checkGrowth(prev, next); err != nil {
		return "", err
	}
	if next.Sequence == prev.Sequence {
		return "", nil
	}
	if next.Sequence != prev.Sequence+1 {
		return "", fmt.Errorf("the bundle sequence went from %d to %d in one step", prev.Sequence, next.Sequence)
	}
	var moves []string
	for i, p := range prev.Authorities {
		if n := next.Authorities[i]; n.Phase != p.Phase {
			moves = append(moves, string(p.Phase)+"→"+string(n.Phase))
		}
	}
	added := next.Authorities[len(prev.Authorities):]
	switch {
	case len(added) == 1 && added[0].Phase == keymgr.PhasePrepared && len(moves) == 0:
		return "prepare", nil
	case len(added) > 0:
		return "", fmt.Errorf("%d authorities added (%v), phases moved %v", len(added), added[0].Phase, moves)
	case slices.Equal(moves, []string{"active→previous", "prepared→active"}), slices.Equal(moves, []string{"prepared→active", "active→previous"}):
		return "activate", nil
	case slices.Equal(moves, []string{"previous→retired"}):
		return "retire", nil
	}
	return "", fmt.Errorf("the sequence moved on by one with the phases moved %v", moves)
}

// killRun starts `meshca args...`, and delay after starting it (or, with
// a from, after from first held for it) freezes it (SIGSTOP), calls look
// with its pid while it stands still, and kills it with SIGKILL. It
// reports whether the process had exited on its own before, with its
// output.
func killRun(t *testing.T, delay time.Duration, from func(pid int) bool, look func(pid int), args ...string) (exited bool, out string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if from != nil {
		waitFor(cmd.Process.Pid, from)
		start = time.Now()
	}
	time.Sleep(delay - time.Since(start))
	freezeAndKill(t, cmd.Process.Pid, cmd.Process.Signal, look)
	err := cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		return false, buf.String()
	}
	if err != nil {
		t.Fatalf("meshca %s, not killed, failed: %v\n%s", strings.Join(args, " "), err, buf.String())
	}
	return true, buf.String()
}

// freezeAndKill stops the process pid (SIGSTOP) through signal, waits
// until it stands still (or has exited: it is not reaped yet, so its pid
// is still its own), calls look, and kills it (SIGKILL). The kill lands
// where the process stood.
func freezeAndKill(t *testing.T, pid int, signal func(os.Signal) error, look func(pid int)) {
	t.Helper()
	if err := signal(syscall.SIGSTOP); err == nil {
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(100 * time.Microsecond) {
			if st := procState(pid); st == "T" || st == "t" || st == "Z" || st == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %d did not stop within 2s of SIGSTOP", pid)
			}
		}
		if look != nil {
			look(pid)
		}
	}
	_ = signal(syscall.SIGKILL)
}

// procState is the state letter of pid in /proc/<pid>/stat, "" if gone.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// pid (comm) S ...; comm may hold spaces, so cut at the last ')'.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return string(b[i+2])
	}
	return ""
}

// waitFor polls every 100µs or so until cond holds for pid, and reports
// whether it did before pid exited or 5 s passed.
func waitFor(pid int, cond func(pid int) bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
		switch {
		case cond(pid):
			return true
		case procState(pid) == "Z":
			return false
		}
	}
	return false
}

// writing is when a process starts to write s: for a directory, once
// it holds the directory's lock; for a Secret, once it is connected to
// the apiserver (the CLI reads the Secret, then writes it).
func (s *crashStore) writing() func(pid int) bool {
	if s.dir != "" {
		lock := filepath.Join(s.dir, dirstore.FileLock)
		return func(pid int) bool { return holdsFlock(pid, lock) }
	}
	u, err := url.Parse(cluster.APIURL)
	if err != nil {
		panic(err)
	}
	return func(pid int) bool { return connectedTo(pid, u.Port()) }
}

// connectedTo reports whether pid has an established TCP connection to
// port, from /proc.
func connectedTo(pid int, port string) bool {
	p, err := strconv.Atoi(port)
	if err != nil {
		return false
	}
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	inodes := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	want := fmt.Sprintf(":%04X", p)
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			// sl local_address rem_address st ... inode
			f := strings.Fields(line)
			if len(f) >= 10 && f[3] == "01" && strings.HasSuffix(f[2], want) && inodes[f[9]] {
				return true
			}
		}
	}
	return false
}

// holdsFlock reports whether pid holds a flock(2) on path, from
// /proc/locks.
func holdsFlock(pid int, path string) bool {
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	ino := fi.Sys().(*syscall.Stat_t).Ino
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(locks), "\n") {
		// 1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF
		f := strings.Fields(line)
		if len(f) >= 6 && f[1] == "FLOCK" && f[4] == strconv.Itoa(pid) && strings.HasSuffix(f[5], ":"+strconv.FormatUint(ino, 10)) {
			return true
		}
	}
	return false
}

// checkUnlocked takes the state directory's lock in-process, as the next
// command would: a killed holder must never leave it taken.
func checkUnlocked(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return // killed before it made the directory
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	unlock, err := dirstore.LockDir(ctx, dir)
	if err != nil {
		t.Fatalf("after the kill, the state directory's lock is still taken: %v", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
}

// spread is n points spread evenly over [lo, hi].
func spread(n int, lo, hi float64) []float64 {
	var out []float64
	for i := range n {
		out = append(out, lo+(hi-lo)*float64(i)/float64(max(n-1, 1)))
	}
	return out
}

// randomPoints is n random points in [0, 1); the seed is logged.
func randomPoints(t *testing.T, n int) []float64 {
	seed := uint64(time.Now().UnixNano())
	t.Logf("random kill points: seed %d", seed)
	r := rand.New(rand.NewPCG(seed, seed))
	out := make([]float64, n)
	for i := range out {
		out[i] = r.Float64()
	}
	return out
}

// tally counts what the kills hit, by where they landed.
type tally map[string]int

func (c tally) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, c[k]))
	}
	return strings.Join(parts, "; ")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
