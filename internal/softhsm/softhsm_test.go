package softhsm

import (
	"reflect"
	"testing"
)

// listing is pkcs11-tool 0.23's --list-objects of a SoftHSM2 token holding
// one EC key pair generated in it.
const listing = `Private Key Object; EC
  label:      meshca-root-20261206T194200Z
  ID:         9a3f01
  Usage:      sign
  Access:     sensitive, always sensitive, never extractable, local
Public Key Object; EC  EC_POINT 256 bits
  EC_POINT:   0441044e
  EC_PARAMS:  06082a8648ce3d030107
  label:      meshca-root-20261206T194200Z
  ID:         9a3f01
  Usage:      verify
  Access:     local
`

func TestParseObjects(t *testing.T) {
	got := parseObjects([]byte(listing))
	want := []Object{
		{Class: "Private Key", KeyType: "EC", Label: "meshca-root-20261206T194200Z", ID: "9a3f01",
			Usage: []string{"sign"}, Access: []string{"sensitive", "always sensitive", "never extractable", "local"}},
		{Class: "Public Key", KeyType: "EC", Label: "meshca-root-20261206T194200Z", ID: "9a3f01",
			Usage: []string{"verify"}, Access: []string{"local"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseObjects:\n got %+v\nwant %+v", got, want)
	}
}
