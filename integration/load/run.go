package load

import (
	"slices"
	"sync"
	"time"
)

// Sample is what one measurement saw.
type Sample struct {
	N, Errs  int
	FirstErr error
	Elapsed  time.Duration
	// Lat are the latencies of the requests that succeeded, sorted.
	Lat []time.Duration
	// CPU is the CPU time each process of the Meter used over the
	// measurement, by name.
	CPU map[string]time.Duration
}

// Rate is requests served per second.
func (s *Sample) Rate() float64 { return float64(s.N) / s.Elapsed.Seconds() }

// Pct is the latency below which fraction p of the requests finished.
func (s *Sample) Pct(p float64) time.Duration {
	if len(s.Lat) == 0 {
		return 0
	}
	return s.Lat[min(len(s.Lat)-1, int(float64(len(s.Lat))*p))]
}

// CPUPerReq is the CPU time process name used per request served.
func (s *Sample) CPUPerReq(name string) time.Duration {
	if s.N == 0 {
		return 0
	}
	return s.CPU[name] / time.Duration(s.N)
}

// Sustain runs streams goroutines, each calling call back to back (with
// its stream number and a count that differs for every call), for warmup
// and then for d. Only the calls that complete within d count, for the
// rate and for the latencies.
func Sustain(streams int, call func(stream, i int) error, warmup, d time.Duration, m *Meter) *Sample {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		out    = &Sample{Elapsed: d}
		from   = time.Now().Add(warmup)
		until  = from.Add(d)
		marked = make(chan struct{})
		cpu0   map[string]time.Duration
	)
	go func() {
		time.Sleep(time.Until(from))
		cpu0 = m.Read()
		close(marked)
	}()
	for s := range streams {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1024)
			var errs int
			var first error
			for i := s; ; i += streams {
				t0 := time.Now()
				err := call(s, i)
				t1 := time.Now()
				if t1.After(until) {
					break
				}
				if t1.Before(from) {
					continue
				}
				if err != nil {
					errs++
					if first == nil {
						first = err
					}
					continue
				}
				lat = append(lat, t1.Sub(t0))
			}
			mu.Lock()
			defer mu.Unlock()
			out.Lat = append(out.Lat, lat...)
			out.Errs += errs
			if out.FirstErr == nil {
				out.FirstErr = first
			}
		})
	}
	<-marked
	time.Sleep(time.Until(until))
	cpu1 := m.Read()
	wg.Wait()
	out.CPU = diff(cpu1, cpu0)
	out.N = len(out.Lat)
	slices.Sort(out.Lat)
	return out
}

// Burst makes every call at once, one goroutine each, and waits for all.
func Burst(calls []func() error, m *Meter) *Sample {
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		out = &Sample{}
	)
	cpu0 := m.Read()
	start := time.Now()
	for _, call := range calls {
		wg.Go(func() {
			t0 := time.Now()
			err := call()
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				out.Errs++
				if out.FirstErr == nil {
					out.FirstErr = err
				}
				return
			}
			out.Lat = append(out.Lat, d)
		})
	}
	wg.Wait()
	out.Elapsed = time.Since(start)
	out.CPU = diff(m.Read(), cpu0)
	out.N = len(out.Lat)
	slices.Sort(out.Lat)
	return out
}
