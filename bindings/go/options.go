package kvxfer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Option configures NewTransport.
type Option func(*settings)

type settings struct {
	keys   []string // option keys in the order given (later ones win in C)
	values []string
	config string // JSON text, "" for none
	err    error  // first invalid option
}

func (s *settings) set(key, value string) {
	s.keys = append(s.keys, key)
	s.values = append(s.values, value)
}

func (s *settings) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// WithOption sets one option of the C library by key (kvx_options_set), for
// example WithOption("tcp.listen", "127.0.0.1:0") or
// WithOption("tcp.streams", "4"). Keys and values are validated by
// NewTransport. Every key, its values, default and meaning: the man page
// kvx_options_set(3) (docs/man/kvx_options_set.3 in the kvxfer sources); the
// With* helpers below only set one of them.
func WithOption(key, value string) Option {
	return func(s *settings) { s.set(key, value) }
}

// WithBackend sets option "backend": "auto", or the backends to serve on.
func WithBackend(name string) Option { return WithOption("backend", name) }

// WithTCPListen sets option "tcp.listen", the address to listen on.
func WithTCPListen(addr string) Option { return WithOption("tcp.listen", addr) }

// WithTCPAdvertise sets option "tcp.advertise" to addrs ("HOST:PORT" each),
// joined with commas.
func WithTCPAdvertise(addrs ...string) Option {
	return WithOption("tcp.advertise", strings.Join(addrs, ","))
}

// WithTCPStreams sets option "tcp.streams".
func WithTCPStreams(n int) Option { return WithOption("tcp.streams", strconv.Itoa(n)) }

// WithConnectTimeout sets option "connect_timeout_ms" to d, which must be
// positive, rounded up to whole milliseconds.
func WithConnectTimeout(d time.Duration) Option {
	return durationOption("connect_timeout_ms", "WithConnectTimeout", d)
}

// WithTransferTimeout sets option "transfer_timeout_ms" to d, which must be
// positive, rounded up to whole milliseconds.
func WithTransferTimeout(d time.Duration) Option {
	return durationOption("transfer_timeout_ms", "WithTransferTimeout", d)
}

// WithTimeouts sets both the connect and the transfer timeout.
func WithTimeouts(connect, transfer time.Duration) Option {
	return func(s *settings) {
		WithConnectTimeout(connect)(s)
		WithTransferTimeout(transfer)(s)
	}
}

func durationOption(key, name string, d time.Duration) Option {
	return func(s *settings) {
		if d <= 0 {
			s.fail(newError("NewTransport", CodeInvalid, fmt.Sprintf("%s(%v): the timeout must be positive", name, d)))
			return
		}
		ms := (d + time.Millisecond - 1) / time.Millisecond
		s.set(key, strconv.FormatInt(int64(ms), 10))
	}
}

// WithConfigJSON sets the model config whose fingerprint peers must share,
// as a JSON object text. The C library canonicalizes it exactly as Python's
// json.dumps(fields, sort_keys=True, separators=(",", ":")) would, so any
// spacing or key order gives the same fingerprint. "" (the default), "null"
// and "{}" mean no fingerprint (compatible with every peer).
func WithConfigJSON(configJSON string) Option {
	return func(s *settings) { s.config = configJSON }
}

// WithConfig sets the model config from Go values (see ConfigJSON for how
// they are encoded). A nil or empty map means no fingerprint.
func WithConfig(fields map[string]any) Option {
	return func(s *settings) {
		text, err := ConfigJSON(fields)
		if err != nil {
			s.fail(newError("NewTransport", CodeConfig, err.Error()))
			return
		}
		s.config = text
	}
}

// ConfigJSON encodes config fields the way the fingerprint needs them:
// like encoding/json, except that float32 and float64 values always keep a
// fraction or exponent (10000.0 is written "10000.0", not "10000"), because
// Python's json.dumps writes a float 10000.0 as "10000.0" and an int as
// "10000", and the two give different fingerprints. Use json.Number (or
// WithConfigJSON) to control a number's text exactly. NaN and infinities are
// written as Python writes them (NaN, Infinity); the C library rejects them.
// Maps with string keys, slices, arrays and pointers are walked with the same
// rule; other values (structs, json.Marshaler implementations) go through
// encoding/json, with its float formatting. A nil or empty map gives "".
func ConfigJSON(fields map[string]any) (string, error) {
	if len(fields) == 0 {
		return "", nil
	}
	var b bytes.Buffer
	if err := encodeConfig(&b, fields); err != nil {
		return "", err
	}
	return b.String(), nil
}

func encodeConfig(b *bytes.Buffer, v any) error {
	if n, ok := v.(json.Number); ok {
		b.WriteString(n.String())
		return nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Invalid:
		b.WriteString("null")
		return nil
	case reflect.Float32, reflect.Float64:
		b.WriteString(pyFloat(rv.Float(), rv.Type().Bits()))
		return nil
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			b.WriteString("null")
			return nil
		}
		if _, ok := v.(json.Marshaler); !ok {
			return encodeConfig(b, rv.Elem().Interface())
		}
	case reflect.Map:
		if _, ok := v.(json.Marshaler); ok || rv.Type().Key().Kind() != reflect.String {
			break
		}
		if rv.IsNil() {
			b.WriteString("null")
			return nil
		}
		keys := make([]string, 0, rv.Len())
		for _, k := range rv.MapKeys() {
			keys = append(keys, k.String())
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encodeJSON(b, k); err != nil {
				return err
			}
			b.WriteByte(':')
			val := rv.MapIndex(reflect.ValueOf(k).Convert(rv.Type().Key()))
			if err := encodeConfig(b, val.Interface()); err != nil {
				return fmt.Errorf("config field %q: %w", k, err)
			}
		}
		b.WriteByte('}')
		return nil
	case reflect.Slice, reflect.Array:
		if _, ok := v.(json.Marshaler); ok || rv.Type().Elem().Kind() == reflect.Uint8 {
			break // []byte is base64 text in encoding/json
		}
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			b.WriteString("null")
			return nil
		}
		b.WriteByte('[')
		for i := 0; i < rv.Len(); i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encodeConfig(b, rv.Index(i).Interface()); err != nil {
				return err
			}
		}
		b.WriteByte(']')
		return nil
	}
	return encodeJSON(b, v)
}

// encodeJSON appends v as encoding/json writes it (without HTML escaping,
// which the C library's canonicalization would undo anyway).
func encodeJSON(b *bytes.Buffer, v any) error {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	b.Truncate(b.Len() - 1) // Encode appends a newline
	return nil
}

// pyFloat writes f so that it parses back as a float (never as an integer).
func pyFloat(f float64, bitSize int) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	s := strconv.FormatFloat(f, 'g', -1, bitSize)
	if !strings.ContainsAny(s, ".eE") {
		s += ".0"
	}
	return s
}
