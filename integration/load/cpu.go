package load

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Self names this process in a Meter's readings.
const Self = "client"

// Meter reads the CPU time of processes by name: Self, and each of Pids.
type Meter struct {
	Pids map[string]int
}

// Read returns the CPU time (user and system) each process has used.
// A nil Meter reads only Self.
func (m *Meter) Read() map[string]time.Duration {
	out := map[string]time.Duration{}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out[Self] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if m != nil {
		for name, pid := range m.Pids {
			out[name], _ = ProcCPU(pid)
		}
	}
	return out
}

func diff(a, b map[string]time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	for k, v := range a {
		out[k] = v - b[k]
	}
	return out
}

// ProcCPU is utime+stime of pid from /proc/<pid>/stat, counted in clock
// ticks of 1/100 s (USER_HZ, 100 on Linux).
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: count the fields
	// after its closing parenthesis (state is field 3, utime 14, stime 15).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(u+k) * 10 * time.Millisecond, nil
}

// Raw is a measurement of the raw limit: how many times a second
// GOMAXPROCS goroutines together run the raw work, and its CPU time per op.
type Raw struct {
	Rate float64
	CPU  time.Duration
}

// RawLimit measures op on workers goroutines for d, in three parts, and
// returns the best rate and the least CPU per op of the three: what this
// machine's cores do when other work on them is least in the way.
func RawLimit(op func(), workers int, d time.Duration) Raw {
	for range 32 {
		op() // warm up
	}
	rs := make([]Raw, 3)
	for i := range rs {
		rs[i] = rawOnce(op, workers, d/3)
	}
	return Best(rs)
}

func rawOnce(op func(), workers int, d time.Duration) Raw {
	var done atomic.Int64
	var wg sync.WaitGroup
	c0 := (*Meter)(nil).Read()[Self]
	start := time.Now()
	until := start.Add(d)
	for range workers {
		wg.Go(func() {
			for time.Now().Before(until) {
				op()
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	c1 := (*Meter)(nil).Read()[Self]
	n := done.Load()
	if n == 0 {
		return Raw{}
	}
	return Raw{Rate: float64(n) / elapsed.Seconds(), CPU: (c1 - c0) / time.Duration(n)}
}

// Best returns the best of measurements: the highest rate and the least
// CPU per op.
func Best(rs []Raw) Raw {
	var b Raw
	for _, r := range rs {
		b.Rate = max(b.Rate, r.Rate)
		if b.CPU == 0 || (r.CPU > 0 && r.CPU < b.CPU) {
			b.CPU = r.CPU
		}
	}
	return b
}

// LoadAvg is the first three fields of /proc/loadavg: how busy the
// machine was, which shared machines need said next to any figure.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
