package trustprom_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/ca/trust/trustprom"
)

func TestCounter(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c, err := trustprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	c.ObserveWrite(trust.ResultCreated)
	c.ObserveWrite(trust.ResultCreated)
	c.ObserveWrite(trust.ResultUpdated)

	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meshca_trust_configmap_writes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		trust.ResultCreated: 2, trust.ResultUpdated: 1,
		trust.ResultConflict: 0, trust.ResultForbidden: 0, trust.ResultError: 0,
	}
	for result, w := range want {
		if v, ok := got[result]; !ok || v != w {
			t.Errorf("result=%q: %v (present %v), want %v", result, v, ok, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("series %v, want %v", got, want)
	}
	if _, err := trustprom.New(reg); err == nil {
		t.Error("registering twice: want an error")
	}
}
