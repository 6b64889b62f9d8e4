package main

import (
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
)

// newLogger builds the daemon's one logger: JSON by default, the console
// format on a terminal ("auto") or when asked for.
func newLogger(level, format string, w *os.File) zerolog.Logger {
	var out io.Writer = w
	if format == "console" || (format == "auto" && isTerminal(w)) {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger()
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
