//go:build scale

package scale

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// targetN is the fleet size the targets are set at.
const targetN = 10000

// figure is one row of the report: how to read it off a run, how to print
// it, and the target at targetN if there is one.
type figure struct {
	name   string
	value  func(*runResult) float64
	format func(float64) string
	target string
	met    func(*runResult) bool
}

func msf(v float64) string    { return fmt.Sprintf("%.2f ms", v) }
func secf(v float64) string   { return fmt.Sprintf("%.2f s", v) }
func ratef(v float64) string  { return fmt.Sprintf("%.0f /s", v) }
func countf(v float64) string { return fmt.Sprintf("%.0f", v) }
func coref(v float64) string  { return fmt.Sprintf("%.2f cores", v) }
func mbf(v float64) string    { return fmt.Sprintf("%.0f MB", v) }
func kbf(v float64) string    { return fmt.Sprintf("%.1f KB", v) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// finishedRate is the execs finished in the throughput window, a second.
func finishedRate(r *runResult) float64 {
	w := r.throughput.w
	return float64(r.throughput.st.finishedBy) / (w.end - w.start).Seconds()
}

// left is what the 1,000/s phase left unfinished after its drain.
func left(r *runResult) int { return r.throughput.st.undelivered + r.throughput.st.unfinished }

func figures() []figure {
	return []figure{
		{name: "daemons registered", value: func(r *runResult) float64 { return float64(r.registered) }, format: countf},
		{name: "time to register all", value: func(r *runResult) float64 { return r.register.Seconds() }, format: secf},
		{name: "then to settle (first polls served)", value: func(r *runResult) float64 { return r.settle.Seconds() }, format: secf},
		{name: "dispatch p50 @100/s", value: func(r *runResult) float64 { return ms(r.dispatch.st.dispatch.quantile(0.5)) }, format: msf},
		{
			name: "dispatch p99 @100/s", value: func(r *runResult) float64 { return ms(r.dispatch.st.dispatch.quantile(0.99)) }, format: msf,
			target: "<= 10 ms", met: func(r *runResult) bool { return r.dispatch.st.dispatch.quantile(0.99) <= 10*time.Millisecond },
		},
		{name: "round trip p50 @100/s", value: func(r *runResult) float64 { return ms(r.dispatch.st.roundTrip.quantile(0.5)) }, format: msf},
		{name: "round trip p99 @100/s", value: func(r *runResult) float64 { return ms(r.dispatch.st.roundTrip.quantile(0.99)) }, format: msf},
		{name: "operator POST p99 @100/s", value: func(r *runResult) float64 { return ms(r.dispatch.st.post.quantile(0.99)) }, format: msf},
		{name: "execs offered @100/s", value: func(r *runResult) float64 { return float64(r.dispatch.w.offered) }, format: countf},
		{
			name: "finished of 1000/s offered", value: finishedRate, format: ratef,
			target: ">= 950 /s, no errors", met: func(r *runResult) bool { return finishedRate(r) >= 950 && r.throughput.errors == 0 && left(r) == 0 },
		},
		{name: "unfinished at the window's end", value: func(r *runResult) float64 { return float64(r.throughput.w.offered - r.throughput.st.finishedBy) }, format: countf},
		{name: "left unfinished after the drain", value: func(r *runResult) float64 { return float64(left(r)) }, format: countf},
		{name: "operator POST p99 @1000/s", value: func(r *runResult) float64 { return ms(r.throughput.st.post.quantile(0.99)) }, format: msf},
		{name: "dispatch p99 @1000/s (delivered)", value: func(r *runResult) float64 { return ms(r.throughput.st.dispatch.quantile(0.99)) }, format: msf},
		{name: "round trip p99 @1000/s (finished)", value: func(r *runResult) float64 { return ms(r.throughput.st.roundTrip.quantile(0.99)) }, format: msf},
		{name: "errors @1000/s", value: func(r *runResult) float64 { return float64(r.throughput.errors) }, format: countf},
		{name: "errors, whole run", value: func(r *runResult) float64 { return float64(r.errors) }, format: countf, target: "0", met: func(r *runResult) bool { return r.errors == 0 }},
		{name: "control plane CPU, registering", value: func(r *runResult) float64 { return r.cpuRegister[0] }, format: coref},
		{name: "control plane CPU @100/s", value: func(r *runResult) float64 { return r.dispatch.cpu[0] }, format: coref},
		{name: "control plane CPU @1000/s", value: func(r *runResult) float64 { return r.throughput.cpu[0] }, format: coref},
		{name: "load generator CPU @1000/s", value: func(r *runResult) float64 { return r.throughput.cpu[1] }, format: coref},
		// The machine is shared: what else ran beside the benchmark (other
		// users, and softirq time no process is charged with).
		{name: "rest of the machine CPU, registering", value: func(r *runResult) float64 { return r.cpuRegister[2] }, format: coref},
		{name: "rest of the machine CPU @100/s", value: func(r *runResult) float64 { return r.dispatch.cpu[2] }, format: coref},
		{name: "rest of the machine CPU @1000/s", value: func(r *runResult) float64 { return r.throughput.cpu[2] }, format: coref},
		{
			name: "control plane RSS at the end", value: func(r *runResult) float64 { return float64(r.mem.RSS) / (1 << 20) }, format: mbf,
			target: "<= 400 MB", met: func(r *runResult) bool { return r.mem.RSS <= 400<<20 },
		},
		{name: "control plane peak RSS (VmHWM)", value: func(r *runResult) float64 { return float64(r.mem.HWM) / (1 << 20) }, format: mbf},
		{name: "RSS per daemon", value: func(r *runResult) float64 { return float64(r.mem.RSS) / 1024 / float64(r.n) }, format: kbf},
		{name: "connections the daemons opened", value: func(r *runResult) float64 { return float64(r.dials) }, format: countf},
	}
}

// printRuns prints one column per fleet size, each value with its ratio
// to the first run (N=1000 by default), and the targets at N=10000.
func printRuns(w io.Writer, runs []*runResult) {
	if len(runs) == 0 {
		fmt.Fprintln(w, "no fleet ran")
		return
	}
	base := runs[0]
	var at *runResult
	for _, r := range runs {
		if r.n == targetN {
			at = r
		}
	}
	const nameW, colW = 36, 26
	fmt.Fprintf(w, "\n%-*s", nameW, "figure")
	for _, r := range runs {
		h := fmt.Sprintf("N=%d", r.n)
		if r != base {
			h += fmt.Sprintf(" (x N=%d)", base.n)
		}
		fmt.Fprintf(w, " %-*s", colW, h)
	}
	fmt.Fprintf(w, " %-22s %s\n", fmt.Sprintf("target at N=%d", targetN), "")
	fmt.Fprintln(w, strings.Repeat("-", nameW+len(runs)*(colW+1)+32))
	for _, f := range figures() {
		fmt.Fprintf(w, "%-*s", nameW, f.name)
		b := f.value(base)
		for _, r := range runs {
			v := f.value(r)
			cell := f.format(v)
			if r != base {
				if b != 0 {
					cell += fmt.Sprintf(" (%.2fx)", v/b)
				} else {
					cell += " (-)"
				}
			}
			fmt.Fprintf(w, " %-*s", colW, cell)
		}
		verdict := ""
		switch {
		case f.met == nil:
		case at == nil:
			verdict = "(no N=10000 run)"
		case f.met(at):
			verdict = "met"
		default:
			verdict = "MISSED"
		}
		fmt.Fprintf(w, " %-22s %s\n", f.target, verdict)
	}
	fmt.Fprintln(w)
	for _, r := range runs {
		fmt.Fprintf(w, "N=%d errors: %s\n", r.n, r.errDetail)
		if !r.quiet {
			fmt.Fprintf(w, "N=%d: the control plane was still busy %v after the boot; the phases ran anyway\n", r.n, settleTimeout)
		}
		if r.redelivered > 0 {
			fmt.Fprintf(w, "N=%d: %d execs carried by a poll again (retried polls; skipped)\n", r.n, r.redelivered)
		}
	}
	fmt.Fprintln(w)
}

// printReplicas prints the two-replica run.
func printReplicas(w io.Writer, r *replicaResult) {
	p99 := r.cross.st.dispatch.quantile(0.99)
	verdict := "met"
	if p99 >= 50*time.Millisecond {
		verdict = "MISSED"
	}
	row := func(name, value, target, verdict string) {
		fmt.Fprintf(w, "%-44s %-18s %-12s %s\n", name, value, target, verdict)
	}
	fmt.Fprintf(w, "\ntwo replicas on one PostgreSQL, %d daemons (half on each), execs queued at A for daemons polling B\n", r.n)
	fmt.Fprintln(w, strings.Repeat("-", 84))
	row("daemons registered", countf(float64(r.registered)), "", "")
	row("time to register all", secf(r.register.Seconds()), "", "")
	row("then to settle (first polls served)", settled(r.settle, r.quiet), "", "")
	row("dispatch p50 A->B @100/s", msf(ms(r.cross.st.dispatch.quantile(0.5))), "", "")
	row("dispatch p99 A->B @100/s", msf(ms(p99)), "< 50 ms", verdict)
	row("round trip p50 A->B @100/s", msf(ms(r.cross.st.roundTrip.quantile(0.5))), "", "")
	row("operator POST p99 at A @100/s", msf(ms(r.cross.st.post.quantile(0.99))), "", "")
	row("round trip p99 A->B @100/s", msf(ms(r.cross.st.roundTrip.quantile(0.99))), "", "")
	row("execs offered", countf(float64(r.cross.w.offered)), "", "")
	row("errors, whole run", countf(float64(r.errors)), "", "")
	row("replica A CPU @100/s", coref(r.cross.cpu[0]), "", "")
	row("replica B CPU @100/s", coref(r.cross.cpu[1]), "", "")
	row("rest of the machine CPU @100/s", coref(r.cross.cpu[3]), "", "")
	row("replica A RSS at the end", mbf(float64(r.mem[0].RSS)/(1<<20)), "", "")
	row("replica B RSS at the end", mbf(float64(r.mem[1].RSS)/(1<<20)), "", "")
	row("connections the daemons opened", countf(float64(r.dials)), "", "")
	fmt.Fprintf(w, "errors: %s\n\n", r.errDetail)
}
