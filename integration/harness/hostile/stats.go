package hostile

import (
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Counts is what one kind of attack did so far.
type Counts struct {
	// Dials are the connections opened (or tried); Refused the ones
	// the server closed, or refused, before it let them in (before the
	// TLS handshake and the server's SETTINGS, its first bytes or its
	// answer, or within RefusedWithin for a silent connection);
	// Closed the ones it closed later, after LifeMean on average and
	// LifeMax at most.
	Dials, Refused, Closed int64
	LifeMean, LifeMax      Duration
	// Held is the connections the server holds now, HeldMax the most it
	// held at once.
	Held, HeldMax int64
	// Streams are the streams opened, StreamsClosed the ones the server
	// ended (RST_STREAM or END_STREAM), StreamsHeld those open now and
	// StreamsHeldMax the most at once (HalfOpen and Watch).
	Streams, StreamsClosed, StreamsHeld, StreamsHeldMax int64
	// LocalErrors are failures of the attacker's own (out of file
	// descriptors or ports); LastEnd is how the last connection the
	// server ended ended, and LastLocal the last local failure.
	LocalErrors        int64
	LastEnd, LastLocal string `json:",omitempty"`
}

// Duration is a time.Duration that reads as one in JSON ("1.5s").
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// Snapshot is every kind's counts, by kind name.
type Snapshot map[string]Counts

// Line is one line cmd/attack prints: what it holds after Elapsed, and
// when Final, once it has closed everything.
type Line struct {
	Elapsed Duration `json:"elapsed"`
	Final   bool     `json:"final,omitempty"`
	Kinds   Snapshot `json:"kinds"`
}

// Snapshot returns what each kind run did so far.
func (a *Attacker) Snapshot() Snapshot {
	out := Snapshot{}
	for _, k := range a.cfg.Kinds {
		out[k.String()] = a.stats[k].counts()
	}
	return out
}

// RefusedWithin: a silent connection the server closes this soon after
// it was opened was refused, not let in.
const RefusedWithin = time.Second

// counts are one kind's counters.
type counts struct {
	dials, refused, closed      atomic.Int64
	lifeSum, lifeMax            atomic.Int64
	held, heldMax               atomic.Int64
	streams, streamsClosed      atomic.Int64
	streamsHeld, streamsHeldMax atomic.Int64
	localErrors                 atomic.Int64
	mu                          sync.Mutex
	lastEnd, lastLocal          string
}

// conn is one connection's part in its kind's counts.
type conn struct {
	s     *counts
	start time.Time
	est   bool
}

func (s *counts) begin() *conn {
	s.dials.Add(1)
	return &conn{s: s, start: time.Now()}
}

// established: the server let c in.
func (c *conn) established() {
	c.est = true
	raise(&c.s.heldMax, c.s.held.Add(1))
}

// streamOpened and streamClosed count one stream of c's.
func (c *conn) streamOpened() {
	c.s.streams.Add(1)
	raise(&c.s.streamsHeldMax, c.s.streamsHeld.Add(1))
}

func (c *conn) streamClosed(byServer bool) {
	c.s.streamsHeld.Add(-1)
	if byServer {
		c.s.streamsClosed.Add(1)
	}
}

// end records how c ended: stopped by the attacker itself, refused by
// the server, or closed by it after it let it in.
func (s *counts) end(c *conn, est, stopped bool, err error) {
	if est {
		s.held.Add(-1)
	}
	switch {
	case stopped:
	case local(err):
		s.localErrors.Add(1)
		s.set(&s.lastLocal, err)
	case !est:
		s.refused.Add(1)
		s.set(&s.lastEnd, err)
	default:
		life := time.Since(c.start)
		s.closed.Add(1)
		s.lifeSum.Add(int64(life))
		raise(&s.lifeMax, int64(life))
		s.set(&s.lastEnd, err)
	}
}

func (s *counts) set(p *string, err error) {
	msg := "closed"
	if err != nil {
		msg = err.Error()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	*p = msg
}

func (s *counts) counts() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Counts{Dials: s.dials.Load(), Refused: s.refused.Load(), Closed: s.closed.Load(),
		LifeMax: Duration(s.lifeMax.Load()), Held: s.held.Load(), HeldMax: s.heldMax.Load(),
		Streams: s.streams.Load(), StreamsClosed: s.streamsClosed.Load(), StreamsHeld: s.streamsHeld.Load(),
		StreamsHeldMax: s.streamsHeldMax.Load(), LocalErrors: s.localErrors.Load(), LastEnd: s.lastEnd, LastLocal: s.lastLocal}
	if c.Closed > 0 {
		c.LifeMean = Duration(s.lifeSum.Load() / c.Closed)
	}
	return c
}

// local reports whether err is the attacker's own failure, not the
// server's doing.
func local(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.EADDRNOTAVAIL) ||
		errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.ENOBUFS)
}

// raise sets *m to v if v is larger.
func raise(m *atomic.Int64, v int64) {
	for {
		old := m.Load()
		if v <= old || m.CompareAndSwap(old, v) {
			return
		}
	}
}
