package keymgr

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// exactKeys checks that every object of the JSON document data uses only
// the names the Go type t gives its fields (exactly: encoding/json
// matches names regardless of case), each at most once (encoding/json
// keeps the last of two). A person reading an edited state must see what
// meshca uses: "SEQUENCE", or a second "phase", would be read one way by
// the person and another by meshca. Values are left to json.Unmarshal.
func exactKeys(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkKeys(dec, t, "the document")
}

func walkKeys(dec *json.Decoder, t reflect.Type, where string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch tok {
	case json.Delim('{'):
		var names map[string]reflect.Type
		if t != nil && t.Kind() == reflect.Struct {
			names = jsonNames(t)
		}
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := k.(string)
			if seen[key] {
				return fmt.Errorf("%s has the field %q twice", where, key)
			}
			seen[key] = true
			var inner reflect.Type
			switch {
			case names != nil:
				ft, ok := names[key]
				if !ok {
					return fmt.Errorf("%s has the unknown field %q", where, key)
				}
				inner = ft
			case t != nil && t.Kind() == reflect.Map:
				inner = t.Elem()
			}
			if err := walkKeys(dec, inner, fmt.Sprintf("%s.%s", where, key)); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walkKeys(dec, elem, fmt.Sprintf("%s[%d]", where, i)); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	}
	return nil
}

// jsonNames maps the JSON names of struct type t's fields to their types,
// as encoding/json names them: exported fields, and the fields of an
// embedded struct without a name of its own, promoted.
func jsonNames(t reflect.Type) map[string]reflect.Type {
	names := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if ft := f.Type; f.Anonymous && name == "" {
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range jsonNames(ft) {
					if _, shadowed := names[k]; !shadowed {
						names[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		names[name] = f.Type
	}
	return names
}
