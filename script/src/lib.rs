//! Lua placement policies (`placement.script.lua`), run in a sandbox.

/// Compiles `source` without running it: Err with Lua's message (and line) when it does not.
pub fn check(source: &str) -> Result<(), String> {
    let lua = mlua::Lua::new();
    lua.load(source)
        .set_name("script")
        .into_function()
        .map(|_| ())
        .map_err(|e| e.to_string())
}
