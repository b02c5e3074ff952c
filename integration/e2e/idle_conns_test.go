package e2e

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// Issue 11, item 4 asks that 10,000 idle connections hold meshca under
// 300 MB of RSS. Measured (docs/performance.md): 357-414 MiB with
// clients that offer X25519MLKEM768 as Go's do, 336-368 MiB with
// X25519 only; ~31 KiB a connection over a 55 MiB start, of which
// Go's TLS keeps ~6.5 KiB, grpc-go's transport ~5 KiB and its three
// goroutines ~10 KiB of stack: the goal is not met, and these tests
// guard what is against regressions: idleMaxPerConn of anonymous memory
// a connection (grpc-go's default 32 KiB read and write buffers made it
// 55 KiB).
const (
	idleGoal       = 300 << 20
	idleGoalConns  = 10_000
	idleMaxPerConn = 48 << 10
)

// idleUncapped are the flags that let one address hold every connection
// these measurements open, and hold it without a request: the connection
// guard's caps and unauthenticated idle and age limits off.
var idleUncapped = []string{"--max-connections=0", "--max-connections-per-peer=0", "--max-unauthenticated-connections=0",
	"--max-unauthenticated-connections-per-peer=0", "--max-connection-idle-unauthenticated=0", "--max-connection-age-unauthenticated=0"}

// BenchmarkIdleConnections (`make bench`): 10,000 concurrent idle
// connections, each a TLS handshake and an HTTP/2 (gRPC) connection set
// up (preface, SETTINGS both ways) that then sends no request, as
// ztunnels and istio-agents between renewals; meshca's VmRSS (its
// /proc/<pid>/status) once every connection is up. The clients answer the
// server's keepalive pings, as real ones do, and the server may close
// none of them meanwhile.
func BenchmarkIdleConnections(b *testing.B) {
	for b.Loop() {
		r := measureIdleConns(b, idleGoalConns, idleUncapped...)
		b.ReportMetric(float64(r.rss)/(1<<20), "rss-MiB")
		b.ReportMetric(r.xIdle(), "x-idle-server")
		b.ReportMetric(float64(r.anon)/(1<<20), "anon-MiB")
		b.ReportMetric(r.perConn()/1024, "KiB/conn")
		b.ReportMetric(r.setup.Seconds(), "setup-s")
		if r.rss > idleGoal {
			b.Logf("over the goal of %d MiB for %d idle connections (issue 11, item 4)", idleGoal>>20, idleGoalConns)
		}
		if r.perConn() > idleMaxPerConn {
			b.Fatalf("%.1f KiB a connection, more than the %d KiB measured when this was written", r.perConn()/1024, idleMaxPerConn>>10)
		}
	}
}

// TestIdleConnections is BenchmarkIdleConnections at a tenth of the
// connections, which `make test` can afford (10,000 full handshakes take
// 15-30 s on two busy cores): the RSS a connection adds must stay within
// idleMaxPerConn.
func TestIdleConnections(t *testing.T) {
	r := measureIdleConns(t, idleGoalConns/10, idleUncapped...)
	if r.perConn() > idleMaxPerConn {
		t.Fatalf("%.1f KiB a connection, more than the %d KiB measured when this was written", r.perConn()/1024, idleMaxPerConn>>10)
	}
}

// idleResult is what meshca held with conns idle connections.
type idleResult struct {
	conns int
	// VmRSS, and RssAnon (without the binary's pages, which the first
	// handshakes also touch), before the connections and with them.
	before, rss, beforeAnon, anon uint64
	setup                         time.Duration
}

// perConn is the anonymous memory a connection added.
func (r idleResult) perConn() float64 { return float64(r.anon-r.beforeAnon) / float64(r.conns) }

// xIdle is the RSS with the connections over the RSS of the same server
// idle, measured in the same run.
func (r idleResult) xIdle() float64 { return float64(r.rss) / float64(r.before) }

// measureIdleConns starts meshca with args, opens conns idle connections
// to it and reads its RSS.
func measureIdleConns(tb testing.TB, conns int, args ...string) idleResult {
	tb.Helper()
	const dialers = 32
	raiseNoFile(tb, uint64(conns)+1024)
	s := startServer(tb, args...)
	r := idleResult{conns: conns, before: procStatus(tb, s.Pid(), "VmRSS"), beforeAnon: procStatus(tb, s.Pid(), "RssAnon")}
	tc := &tls.Config{RootCAs: s.roots, ServerName: "istiod.istio-system.svc", NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
	start := time.Now()
	var (
		mu     sync.Mutex
		open   []net.Conn
		closed atomic.Int64 // connections the server closed
		next   atomic.Int64
		wg     sync.WaitGroup
		errs   = make(chan error, dialers)
	)
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			c.Close()
		}
	}()
	for range dialers {
		wg.Go(func() {
			for next.Add(1) <= int64(conns) {
				c, err := idleConn(s.Addr, tc, &closed)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				open = append(open, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatalf("after %d connections: %v", len(open), err)
	}
	r.setup = time.Since(start)
	time.Sleep(time.Second) // let the last transports settle
	r.rss, r.anon = procStatus(tb, s.Pid(), "VmRSS"), procStatus(tb, s.Pid(), "RssAnon")
	e := scrapeMetricsTB(tb, s.AdminAddr)
	mib := func(name string) float64 { return sampleValue(e, name, "", "") / (1 << 20) }
	tb.Logf("%d idle TLS+HTTP/2 connections up in %v: meshca VmRSS %d MiB (%d MiB before them), RssAnon %d MiB (%.1f KiB each), VmHWM %d MiB; "+
		"Go heap in use %.0f MiB (allocated %.0f MiB, next GC at %.0f MiB), stacks %.0f MiB, %.0f goroutines",
		len(open), r.setup.Round(time.Millisecond), r.rss>>20, r.before>>20, r.anon>>20, r.perConn()/1024, procStatus(tb, s.Pid(), "VmHWM")>>20,
		mib("go_memstats_heap_inuse_bytes"), mib("go_memstats_heap_alloc_bytes"), mib("go_memstats_next_gc_bytes"),
		mib("go_memstats_stack_inuse_bytes"), sampleValue(e, "go_goroutines", "", ""))
	if n := closed.Load(); n != 0 {
		tb.Fatalf("the server closed %d of the idle connections", n)
	}
	return r
}

// idleConn makes one TLS connection, sets up HTTP/2 on it as a gRPC
// client does and leaves it idle, answering the server's pings in the
// background; closed counts it if the server closes it.
func idleConn(addr string, tc *tls.Config, closed *atomic.Int64) (net.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr, tc)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		c.Close()
		return nil, err
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for settled := false; !settled; {
		f, err := fr.ReadFrame()
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("waiting for the server's SETTINGS: %w", err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			if err := fr.WriteSettingsAck(); err != nil {
				c.Close()
				return nil, err
			}
			settled = true
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					closed.Add(1)
				}
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
				_ = fr.WritePing(true, p.Data)
			}
		}
	}()
	return c, nil
}

// raiseNoFile raises this process's open-file limit to at least n (to
// the hard limit), or skips the test. meshca, a Go program, raises its
// own to its hard limit, which it inherits.
func raiseNoFile(t testing.TB, n uint64) {
	t.Helper()
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	if l.Max < n {
		t.Skipf("RLIMIT_NOFILE hard limit %d is below the %d files this test needs", l.Max, n)
	}
	if l.Cur < n {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			t.Fatal(err)
		}
	}
}

// procStatus reads a "kB" field of /proc/<pid>/status, in bytes.
func procStatus(t testing.TB, pid int, field string) uint64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", field, rest, err)
		}
		return kb << 10
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// scrapeMetricsTB reads meshca's /metrics, for a test or a benchmark.
func scrapeMetricsTB(tb testing.TB, adminAddr string) *exposition {
	tb.Helper()
	r, err := getMetrics(adminAddr)
	if err != nil {
		tb.Fatal(err)
	}
	defer r.Body.Close()
	e, err := parseExposition(r.Body)
	if err != nil {
		tb.Fatalf("/metrics: %v", err)
	}
	return e
}
