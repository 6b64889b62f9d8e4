package cli

// OpenStores lets in-process control planes in tests get the stores serve
// would give them.
var OpenStores = openStores
