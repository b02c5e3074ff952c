package ca

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// ReadyCheck is one dependency readiness waits for: Check returns nil
// while it is met, an error saying what is missing otherwise, or a
// *Degraded error for a failure tolerated for now.
type ReadyCheck struct {
	Name  string
	Check func() error
}

// Degraded is a failure a check tolerates for now (a backend failing for
// less than its grace): readiness holds, and /readyz shows Err on the
// check's ok line.
type Degraded struct{ Err error }

func (d *Degraded) Error() string { return d.Err.Error() }

func (d *Degraded) Unwrap() error { return d.Err }

// Readiness is the checks /readyz reports, in order.
type Readiness []ReadyCheck

// result runs c: note is what a tolerated failure says, fail the
// failure that holds readiness back.
func (c ReadyCheck) result() (note string, fail error) {
	err := c.Check()
	var d *Degraded
	if errors.As(err, &d) {
		return d.Err.Error(), nil
	}
	return "", err
}

// Ready returns nil when every check passes, else an error naming each
// that fails.
func (r Readiness) Ready() error {
	var failed []string
	for _, c := range r {
		if _, err := c.result(); err != nil {
			failed = append(failed, c.Name+": "+err.Error())
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return errors.New(strings.Join(failed, "; "))
}

// ServeHTTP answers /readyz in the kube-apiserver's verbose format, one
// line per check, whatever the query: "[+]name ok" (with what a
// tolerated failure says after a colon) or "[-]name failed: why", then
// "readyz check passed" (200) or "readyz check failed" (503).
func (r Readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	var b strings.Builder
	ok := true
	for _, c := range r {
		note, err := c.result()
		switch {
		case err != nil:
			ok = false
			fmt.Fprintf(&b, "[-]%s failed: %s\n", c.Name, oneLine(err.Error()))
		case note != "":
			fmt.Fprintf(&b, "[+]%s ok: %s\n", c.Name, oneLine(note))
		default:
			fmt.Fprintf(&b, "[+]%s ok\n", c.Name)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		b.WriteString("readyz check failed\n")
	} else {
		b.WriteString("readyz check passed\n")
	}
	_, _ = w.Write([]byte(b.String()))
}

// oneLine keeps a check's line one line.
func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
