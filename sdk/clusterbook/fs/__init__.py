"""Files no one else can turn against their owner: private directories, opening without
following links, removing only inside a root."""
