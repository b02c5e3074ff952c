package trustprom_test

import (
	"testing"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/ca/trust/trustprom"
	"github.com/prometheus/client_golang/prometheus"
)

func TestCounter(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c, err := trustprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	cm, ctb := c.Kind(trustprom.KindConfigMap), c.Kind(trustprom.KindClusterTrustBundle)
	cm.ObserveWrite(trust.ResultCreated)
	cm.ObserveWrite(trust.ResultCreated)
	cm.ObserveWrite(trust.ResultUpdated)
	ctb.ObserveWrite(trust.ResultCreated)
	ctb.ObserveWrite(trust.ResultNotOwned)

	type series struct{ kind, result string }
	got := map[series]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meshca_trust_writes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var s series
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "kind":
					s.kind = l.GetValue()
				case "result":
					s.result = l.GetValue()
				}
			}
			got[s] = m.GetCounter().GetValue()
		}
	}
	want := map[series]float64{
		{"configmap", trust.ResultCreated}: 2, {"configmap", trust.ResultUpdated}: 1,
		{"configmap", trust.ResultConflict}: 0, {"configmap", trust.ResultForbidden}: 0, {"configmap", trust.ResultError}: 0,
		{"configmap", trust.ResultStale}: 0, {"clustertrustbundle", trust.ResultStale}: 0,
		{"clustertrustbundle", trust.ResultCreated}: 1, {"clustertrustbundle", trust.ResultUpdated}: 0,
		{"clustertrustbundle", trust.ResultConflict}: 0, {"clustertrustbundle", trust.ResultForbidden}: 0,
		{"clustertrustbundle", trust.ResultInvalid}: 0, {"clustertrustbundle", trust.ResultNotOwned}: 1,
		{"clustertrustbundle", trust.ResultError}: 0,
	}
	for s, w := range want {
		if v, ok := got[s]; !ok || v != w {
			t.Errorf("%+v: %v (present %v), want %v", s, v, ok, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("series %v, want %v", got, want)
	}
	if _, err := trustprom.New(reg); err == nil {
		t.Error("registering twice: want an error")
	}
}
