package keymgr

import (
	"reflect"
	"strings"
	"testing"
)

// TestExactKeys: names as encoding/json gives them, embedded structs'
// promoted, each once and in its own case.
func TestExactKeys(t *testing.T) {
	type inner struct {
		Depth int `json:"depth"`
	}
	type doc struct {
		inner
		Name  string            `json:"name"`
		Items []inner           `json:"items,omitempty"`
		Extra map[string]string `json:"extra"`
		Plain int
		Skip  int `json:"-"`
	}
	tests := []struct {
		name, data, want string
	}{
		{name: "every kind of field", data: `{"depth":1,"name":"a","items":[{"depth":2}],"extra":{"k":"v"},"Plain":3}`},
		{name: "a promoted field twice", data: `{"depth":1,"depth":2}`, want: `the document has the field "depth" twice`},
		{name: "another case", data: `{"Name":"a"}`, want: `the document has the unknown field "Name"`},
		{name: "a skipped field", data: `{"Skip":1}`, want: `unknown field "Skip"`},
		{name: "in a list", data: `{"items":[{"depth":1},{"Depth":2}]}`, want: `the document.items[1] has the unknown field "Depth"`},
		{name: "a map's keys twice", data: `{"extra":{"k":"a","k":"b"}}`, want: `the document.extra has the field "k" twice`},
		{name: "an escaped name", data: `{"n\u0061me":"a"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := exactKeys([]byte(tt.data), reflect.TypeFor[doc]())
			if (tt.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("exactKeys = %v, want %q", err, tt.want)
			}
		})
	}
}
