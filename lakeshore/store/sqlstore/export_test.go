package sqlstore

// Queries whose plans plan_test.go checks on a migrated SQLite file.
const (
	OpenExecsQuery = openExecsQuery
	LostExecsQuery = lostExecsQuery
)
