package servecli

import (
	"net"
	"testing"
)

func TestLocalURL(t *testing.T) {
	cases := map[string]string{
		"0.0.0.0:7700":  "http://127.0.0.1:7700",
		"[::]:7700":     "http://[::1]:7700",
		"127.0.0.1:9":   "http://127.0.0.1:9",
		"10.1.2.3:7700": "http://10.1.2.3:7700",
	}
	for in, want := range cases {
		addr, err := net.ResolveTCPAddr("tcp", in)
		if err != nil {
			t.Fatal(err)
		}
		if got := localURL(addr); got != want {
			t.Errorf("localURL(%s) = %s, want %s", in, got, want)
		}
	}
}
