package e2e

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
)

// minDefences is how many distinct defences issue 22 asks the matrix to
// exercise.
const minDefences = 60

// matrix counts the hostile rows run and the distinct defences they
// showed to hold: a row counts its defence only when it passed.
type matrix struct {
	rows, skipped int
	filtered      bool // some rows did not run: -run chose others
	failed        []string
	defences      map[string]int
}

// check is a row of a surface other than CreateCertificate: run makes
// the attack and asserts that the defence named held (the status code,
// condition, log line or metric it leaves), not merely that something
// failed.
type check struct {
	name, defence string
	run           func(t *testing.T)
}

func (m *matrix) checks(t *testing.T, cs []check) {
	for _, c := range cs {
		m.row(t, c.name, func(t *testing.T) string { c.run(t); return c.defence })
	}
}

func (m *matrix) attacks(t *testing.T, a *arena, tts []attack) {
	for _, tt := range tts {
		m.attack(t, a, tt)
	}
}

// attack runs a CreateCertificate row on a's meshca; its defence is the
// audit reason it was refused with, or what refused it before meshca's
// handler.
func (m *matrix) attack(t *testing.T, a *arena, tt attack) {
	m.row(t, tt.name, func(t *testing.T) string {
		reason := a.run(t, tt)
		switch {
		case tt.defence != "":
			return tt.defence
		case tt.transport:
			return transportDefence(tt)
		}
		return reason
	})
}

// row runs one row as a subtest and counts it.
func (m *matrix) row(t *testing.T, name string, run func(t *testing.T) string) {
	var ran, skipped bool
	var defence string
	passed := t.Run(name, func(t *testing.T) {
		ran = true
		defer func() { skipped = t.Skipped() }()
		defence = run(t)
	})
	switch {
	case !ran:
		m.filtered = true
		return
	case skipped:
		m.skipped++
	case !passed:
		m.failed = append(m.failed, name)
	default:
		m.defences[defence]++
	}
	m.rows++
}

// report gives CI the figures of the matrix and holds it to minDefences.
func (m *matrix) report(t *testing.T, took time.Duration) {
	names := slices.Sorted(maps.Keys(m.defences))
	t.Logf("defences exercised: %s", strings.Join(names, " "))
	harness.Report(t, "%d hostile rows in %v: %d distinct defences held, %d rows skipped, %d failed",
		m.rows, took.Round(time.Second), len(names), m.skipped, len(m.failed))
	if !m.filtered && len(names) < minDefences {
		t.Errorf("%d distinct defences held, issue 22 asks for at least %d (failed rows: %v)", len(names), minDefences, m.failed)
	}
}

// transportDefences name what refused a row before meshca's handler, by
// the fragment of the message the row expects.
var transportDefences = []struct{ msg, defence string }{
	{"http2:", "transport:header_list_size"},
	{"larger than max", "transport:message_size"},
	{"tls: unknown certificate authority", "transport:tls_unknown_authority"},
	{"tls: expired certificate", "transport:tls_expired_certificate"},
}

func transportDefence(tt attack) string {
	for _, d := range transportDefences {
		if tt.msg != "" && strings.Contains(tt.msg, d.msg) {
			return d.defence
		}
	}
	if strings.Contains(tt.name, "expired certificate") { // TLS 1.3: only the code is sure
		return "transport:tls_expired_certificate"
	}
	return "transport:" + strings.ToLower(tt.code.String())
}
