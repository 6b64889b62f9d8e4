package cli

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// errNotFinite is a float flag given NaN or an infinity, which strconv
// accepts and no count of seconds or rate means.
var errNotFinite = errors.New("not a finite number")

// floatValue is a float64 flag that takes finite numbers only.
type floatValue float64

func (v *floatValue) Set(s string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return err
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return errNotFinite
	}
	*v = floatValue(f)
	return nil
}

func (v *floatValue) String() string { return strconv.FormatFloat(float64(*v), 'g', -1, 64) }

// Type is pflag's own for a float64, so the help reads "float" and
// FlagSet.GetFloat64 reads it.
func (v *floatValue) Type() string { return "float64" }

// floatVar is pflag's Float64Var with a floatValue.
func floatVar(fs *pflag.FlagSet, p *float64, name string, def float64, usage string) {
	*p = def
	fs.Var((*floatValue)(p), name, usage)
}

// flagError is the root's flag error function. pflag reports a bad value
// with its parser's words ("strconv.ParseFloat: parsing ..."); this names
// the flag, what it takes and a value that works instead. Every error is a
// usage error (exit 2).
func flagError(err error) error {
	var iv *pflag.InvalidValueError
	if !errors.As(err, &iv) || iv.GetFlag() == nil {
		return &usageError{err: err}
	}
	f := iv.GetFlag()
	var want, example string
	switch f.Value.Type() {
	case "float", "float64", "float32":
		want, example = "a number", exampleValue(f, "30", "0")
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		want, example = "a whole number", exampleValue(f, "10", "0")
	case "duration":
		want, example = "a duration (a number with a unit: ms, s, m, h)", exampleValue(f, "30s", "0s")
	case "bool":
		want, example = "true or false", "true"
	default:
		return &usageError{err: err}
	}
	return usagef("--%s %q: want %s, e.g. --%s %s", f.Name, iv.GetValue(), want, f.Name, example)
}

// exampleValue is a value of f to show: its bare-flag value, else its
// default unless that is the zero value, else fallback.
func exampleValue(f *pflag.Flag, fallback, zero string) string {
	for _, v := range []string{f.NoOptDefVal, f.DefValue} {
		if v != "" && v != zero {
			return v
		}
	}
	return fallback
}
