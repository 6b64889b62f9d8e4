//go:build !race

package controlplane

func raceNote() string { return "" }
