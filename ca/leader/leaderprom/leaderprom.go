// Package leaderprom exports leadership as Prometheus metrics:
// meshca_leader{lease}, fed by the observers leader.Run takes.
package leaderprom

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics show, per Lease, whether this replica leads it
// (meshca_leader{lease}): summed over the replicas, 1 while some replica
// does the leader-elected work, 0 while none does.
type Metrics struct {
	leader *prometheus.GaugeVec
}

// New registers the gauge with reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "meshca_leader", Help: "1 while this replica leads the Lease named by the lease label, else 0.",
	}, []string{"lease"})}
	reg.MustRegister(m.leader)
	return m
}

// Lease returns the observer of leadership of the Lease named lease (an
// observer of leader.Run); its series exists, at 0, from now on.
func (m *Metrics) Lease(lease string) func(leading bool) {
	g := m.leader.WithLabelValues(lease)
	g.Set(0)
	return func(leading bool) {
		if leading {
			g.Set(1)
		} else {
			g.Set(0)
		}
	}
}
