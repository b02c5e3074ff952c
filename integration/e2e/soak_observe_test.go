package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshca/meshca/integration/harness"
)

// soakObserver looks at each replica every second as its kubelet and
// Prometheus do, from addresses of their own: its RSS (VmRSS of
// /proc/<pid>/status), a readiness probe (/readyz on a new connection,
// with the chart's 2 s timeout), and a scrape of /metrics on a kept
// connection (go_goroutines, meshca_connections_open).
type soakObserver struct {
	replicas []*harness.Meshca
	cur      atomic.Pointer[soakSeen]
	rssMax   []atomic.Int64 // over the whole run
	rssNow   []atomic.Int64
	wg       sync.WaitGroup
}

// Where the observer's requests come from, neither a client's nor an
// attacker's address.
var (
	soakProbeFrom  = net.IPv4(127, 0, 5, 1)
	soakScrapeFrom = net.IPv4(127, 0, 5, 2)
)

// soakRSSAbort stops an attack early, once a replica's RSS has grown by
// that much in the phase (and is past a GiB): that far past the chart's
// 256 MiB memory limit it would long have been OOM-killed, and the
// machine is shared.
const soakRSSAbort = 768 << 20

func newSoakObserver(replicas []*harness.Meshca) *soakObserver {
	o := &soakObserver{replicas: replicas, rssMax: make([]atomic.Int64, len(replicas)), rssNow: make([]atomic.Int64, len(replicas))}
	o.cur.Store(o.newSeen())
	return o
}

// soakSeen is what the observer saw in one phase, each maximum by
// replica.
type soakSeen struct {
	mu                         sync.Mutex
	rss, goroutines, connsOpen []int64
	probes, probesFailed       int
	scrapes, scrapesFailed     int
	probeErr, scrapeErr        string
	// abortAt is the RSS of each replica that stops the phase early;
	// abort why it stopped.
	abortAt []int64
	abort   string
}

func (o *soakObserver) newSeen() *soakSeen {
	n := len(o.replicas)
	s := &soakSeen{rss: make([]int64, n), goroutines: make([]int64, n), connsOpen: make([]int64, n), abortAt: make([]int64, n)}
	for i := range s.abortAt {
		s.abortAt[i] = max(1<<30, o.rssNow[i].Load()+soakRSSAbort)
	}
	return s
}

// begin starts a new phase and returns what the last one saw.
func (o *soakObserver) begin() *soakSeen { return o.cur.Swap(o.newSeen()) }

// aborted says why the phase must stop now, if it must.
func (o *soakObserver) aborted() string {
	s := o.cur.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.abort
}

// run observes until ctx ends; the channel closes when it has stopped.
func (o *soakObserver) run(ctx context.Context) <-chan struct{} {
	probe := &http.Client{Timeout: 2 * time.Second, Transport: soakTransport(soakProbeFrom, true)}
	scrape := &http.Client{Timeout: 5 * time.Second, Transport: soakTransport(soakScrapeFrom, false)}
	for i, m := range o.replicas {
		o.tick(ctx, func() { o.sampleRSS(i, m) })
		o.tick(ctx, func() { o.probe(probe, i, m) })
		o.tick(ctx, func() { o.scrape(scrape, i, m) })
	}
	done := make(chan struct{})
	go func() {
		o.wg.Wait()
		close(done)
	}()
	return done
}

func (o *soakObserver) tick(ctx context.Context, f func()) {
	o.wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			f()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
}

func (o *soakObserver) sampleRSS(i int, m *harness.Meshca) {
	rss, err := statusKB(m.Pid(), "VmRSS")
	s := o.cur.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil || m.Exited() != nil:
		s.abort = fmt.Sprintf("replica %d exited: %v %v", i, m.Exited(), err)
		return
	case rss >= s.abortAt[i] && s.abort == "":
		s.abort = fmt.Sprintf("replica %d's RSS reached %d MiB", i, rss>>20)
	}
	o.rssNow[i].Store(rss)
	raiseTo(&o.rssMax[i], rss)
	s.rss[i] = max(s.rss[i], rss)
}

func (o *soakObserver) probe(c *http.Client, i int, m *harness.Meshca) {
	r, err := c.Get("http://" + m.AdminAddr + "/readyz")
	if err == nil {
		r.Body.Close()
		if r.StatusCode != http.StatusOK {
			err = fmt.Errorf("/readyz: %s", r.Status)
		}
	}
	s := o.cur.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probes++
	if err != nil {
		s.probesFailed++
		s.probeErr = fmt.Sprintf("replica %d: %v", i, err)
	}
}

func (o *soakObserver) scrape(c *http.Client, i int, m *harness.Meshca) {
	g, open, err := soakMetrics(c, m.AdminAddr)
	s := o.cur.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scrapes++
	if err != nil {
		s.scrapesFailed++
		s.scrapeErr = fmt.Sprintf("replica %d: %v", i, err)
		return
	}
	s.goroutines[i], s.connsOpen[i] = max(s.goroutines[i], g), max(s.connsOpen[i], open)
}

// soakMetrics reads go_goroutines and meshca_connections_open from
// /metrics.
func soakMetrics(c *http.Client, admin string) (goroutines, open int64, err error) {
	r, err := c.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer r.Body.Close()
	if r.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("/metrics: %s", r.Status)
	}
	sc := bufio.NewScanner(r.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		v, _ := strconv.ParseFloat(value, 64)
		switch name {
		case "go_goroutines":
			goroutines = int64(v)
		case "meshca_connections_open":
			open = int64(v)
		}
	}
	return goroutines, open, sc.Err()
}

// soakTransport is an HTTP transport from the source address from, a
// new connection for each request when fresh (as the kubelet's probes).
func soakTransport(from net.IP, fresh bool) *http.Transport {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: from}, Timeout: 2 * time.Second}
	return &http.Transport{DialContext: d.DialContext, DisableKeepAlives: fresh, MaxIdleConnsPerHost: 1}
}

// statusKB reads a "kB" field of /proc/<pid>/status, in bytes.
func statusKB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if ok && name == field {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// raiseTo sets *m to v if v is larger.
func raiseTo(m *atomic.Int64, v int64) {
	for old := m.Load(); v > old && !m.CompareAndSwap(old, v); old = m.Load() {
	}
}
