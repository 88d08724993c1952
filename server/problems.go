package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
)

// The HTTP edge turns errors into problem+json details a client can act
// on: what was wrong with the request and what to send instead, in the
// API's own terms (fields, policies), never the Go packages and types the
// error passed through.

// serviceError answers with the problem an error from the Service is.
func serviceError(w http.ResponseWriter, err error) {
	code, detail := serviceProblem(err)
	if code == http.StatusServiceUnavailable {
		// "Try again shortly", said as clients and proxies read it: a
		// second, the failure policy's default breaker probe interval.
		w.Header().Set("Retry-After", storeRetryAfter)
	}
	problem(w, code, detail)
}

// storeRetryAfter is the Retry-After of a 503 whose store did not decide.
const storeRetryAfter = "1"

// decodeError answers with the problem a body that did not decode into v
// (a pointer to a request struct) has.
func decodeError(w http.ResponseWriter, err error, v any) {
	code, detail := decodeProblem(err, v)
	problem(w, code, detail)
}

func serviceProblem(err error) (int, string) {
	switch {
	case errors.Is(err, ErrUnknownPolicy):
		// A name may be 60 KB: clipped before quoting, so that the quotes
		// stay whole and the length is the name's own.
		name := tail(err, ErrUnknownPolicy)
		if raw, uerr := strconv.Unquote(name); uerr == nil {
			name = clipQuoted(raw, logClip)
		} else {
			name = clip(name, logClip)
		}
		return http.StatusNotFound, fmt.Sprintf("there is no policy %s: GET /v1/policies lists the policies", name)
	case errors.Is(err, sluice.ErrInvalidKey):
		var n, most int
		if _, serr := fmt.Sscanf(tail(err, sluice.ErrInvalidKey), "key of %d bytes exceeds %d", &n, &most); serr == nil {
			return http.StatusBadRequest, fmt.Sprintf("key is %d bytes, more than the %d allowed: send a shorter key, or a hash of it", n, most)
		}
		return http.StatusBadRequest, "key is required: name the client to limit, such as an API key, a user id or an IP address"
	case errors.Is(err, sluice.ErrCostExceedsBurst):
		var cost, capacity int64
		fmt.Sscanf(tail(err, sluice.ErrCostExceedsBurst), "cost %d, capacity %d", &cost, &capacity)
		return http.StatusBadRequest, fmt.Sprintf("cost %d exceeds the policy's capacity of %d, so it could never be allowed: send a cost of at most %d", cost, capacity, capacity)
	case errors.Is(err, sluice.ErrInvalidCost):
		return http.StatusBadRequest, "cost must be at least 1 (or left out for the policy's own cost)"
	case errors.Is(err, ErrBadToken):
		return http.StatusBadRequest, "token is not one acquire returned: send the token of an acquire's answer as it came"
	case errors.Is(err, ErrSlotNotHeld):
		return http.StatusNotFound, "the slot is not held: " + tail(err, ErrSlotNotHeld) + "; nothing was freed"
	case errors.Is(err, ErrSlotElsewhere):
		return http.StatusServiceUnavailable, tail(err, ErrSlotElsewhere)
	case errors.Is(err, ErrNoSlots):
		return http.StatusNotImplemented, "this server's store keeps no in-flight slots"
	case errors.Is(err, ErrBadRequest), errors.Is(err, sluice.ErrInvalidLimit):
		return http.StatusBadRequest, scrub(err.Error())
	}
	return http.StatusServiceUnavailable, "the rate-limit store did not answer, or refused the call: try again shortly"
}

// tail is what err says after sentinel's own text: the specifics.
func tail(err, sentinel error) string {
	msg := err.Error()
	if i := strings.Index(msg, sentinel.Error()+": "); i >= 0 {
		return msg[i+len(sentinel.Error())+2:]
	}
	return ""
}

// scrub removes package prefixes ("server: ", "sluice: invalid limit: ",
// "proto: ") from an error's text.
func scrub(msg string) string {
	for _, p := range []string{"server: bad request: ", "server: ", "sluice: invalid limit: ", "sluice: ", "proto:", "json: "} {
		msg = strings.ReplaceAll(msg, p, "")
	}
	// protojson separates its prefix with a space or, at random, a
	// non-breaking one.
	return strings.TrimSpace(strings.TrimLeft(msg, "\u00a0"))
}

func decodeProblem(err error, v any) (int, string) {
	var tooBig *http.MaxBytesError
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooBig):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body exceeds %d bytes", tooBig.Limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The server's read timeout: a client sending too slowly.
		return http.StatusRequestTimeout, "the request body did not arrive in time: send it whole, at once"
	case errors.Is(err, io.EOF):
		return http.StatusBadRequest, "the request body is empty: send a JSON object with the fields " + fieldList(v)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return http.StatusBadRequest, "the request body ends inside its JSON object: send a complete object"
	case errors.As(err, &syntax):
		return http.StatusBadRequest, fmt.Sprintf("the request body is not valid JSON (at byte %d): %s", syntax.Offset, syntax.Error())
	case errors.As(err, &typ) && typ.Field == "":
		return http.StatusBadRequest, "the request body must be a JSON object with the fields " + fieldList(v)
	case errors.As(err, &typ):
		if lo, hi, ok := intRange(typ.Type); ok {
			num := strings.TrimPrefix(typ.Value, "number ")
			if isInteger(num) {
				return http.StatusBadRequest, fmt.Sprintf("field %q is out of range: %s is not between %s and %s", typ.Field, num, lo, hi)
			}
			if f, ok := new(big.Float).SetString(num); ok && f.IsInt() {
				// A whole number in an exponent form, which integer
				// fields do not read.
				if i, acc := f.Int64(); acc == big.Exact && fits(i, lo, hi) {
					return http.StatusBadRequest, fmt.Sprintf("field %q must be written as a plain integer (%d), not %s", typ.Field, i, num)
				}
				return http.StatusBadRequest, fmt.Sprintf("field %q is out of range: %s is not between %s and %s", typ.Field, num, lo, hi)
			}
		}
		return http.StatusBadRequest, fmt.Sprintf("field %q must be %s, not a JSON %s", typ.Field, jsonKind(typ.Type), typ.Value)
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return http.StatusBadRequest, fmt.Sprintf("unknown field %s: the fields are %s", f, fieldList(v))
	}
	return http.StatusBadRequest, scrub(err.Error())
}

// fieldNames are v's JSON field names, as its tags spell them.
func fieldNames(v any) []string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var names []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// fieldList names v's JSON fields: "policy, key and cost".
func fieldList(v any) string {
	names := fieldNames(v)
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// jsonKind names a Go type as JSON would: "a whole number", "a string".
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// intRange is the range of an integer type, for a number that did not
// fit it.
func intRange(t reflect.Type) (lo, hi string, ok bool) {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		min := int64(-1) << (t.Bits() - 1)
		return strconv.FormatInt(min, 10), strconv.FormatInt(-(min + 1), 10), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "0", strconv.FormatUint(uint64(1)<<(t.Bits()-1)<<1-1, 10), true
	}
	return "", "", false
}

// fits reports whether i is within the decimal bounds lo and hi.
func fits(i int64, lo, hi string) bool {
	l, err1 := strconv.ParseInt(lo, 10, 64)
	h, err2 := strconv.ParseUint(hi, 10, 64)
	return err1 == nil && err2 == nil && i >= l && (i < 0 || uint64(i) <= h)
}

// isInteger reports whether s is a JSON number without fraction or
// exponent: one an integer field refuses only for its size.
func isInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
