"""A full agent session against `bgwork mcp`, driven by the official Python MCP SDK client.

Usage: python mcp_session.py BGWORK_BINARY
Prints one line per step and exits non-zero on the first thing that is not as expected.
"""

import asyncio
import json
import os
import subprocess
import sys

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client


def check(condition, what):
    if not condition:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def field(obj, snake, camel):
    """An attribute by its SDK name (snake_case in newer SDKs, camelCase in older)."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


def body(result):
    """The structured result, checked against its JSON text twin."""
    check(not field(result, "is_error", "isError"), "the call succeeded")
    structured = field(result, "structured_content", "structuredContent")
    text = json.loads(result.content[0].text)
    check(structured == text, "structured content and JSON text agree")
    return structured


async def main(binary):
    env = dict(os.environ)
    env["BGWORK_SESSION"] = "interop"
    env["BGWORK_MCP_PROGRESS_MS"] = "200"
    params = StdioServerParameters(command=binary, args=["mcp"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            check(field(init, "server_info", "serverInfo").name == "bgwork", "initialize names the server")
            listed = (await session.list_tools()).tools
            tools = {tool.name for tool in listed}
            wanted = {"start", "run", "list", "read", "send", "stop", "wait", "monitor", "notices",
                      "resize", "dismiss", "restart", "agent_start"}
            check(wanted <= tools, f"tools/list offers {sorted(wanted)}")
            undescribed = [f"{tool.name}.{name}" for tool in listed
                           for name, prop in field(tool, "input_schema", "inputSchema")["properties"].items()
                           if not prop.get("description")]
            check(undescribed == [], f"every property has a description ({undescribed})")
            hints = {tool.name: tool.annotations for tool in listed}
            check(all(field(hints[name], "read_only_hint", "readOnlyHint") for name in ("list", "read", "wait", "notices")),
                  "list, read, wait and notices are read-only")
            check(field(hints["stop"], "destructive_hint", "destructiveHint") is True, "stop is destructive")

            started = body(await session.call_tool("start", {
                "command": "echo compiling; read go; echo 'tests: 41 passed, 1 failed'; exit 1",
                "notify": True, "window_ms": 0, "name": "suite"}))
            job = started["id"]
            check(job.startswith("bg-") and started["state"] in ("starting", "running"), f"start returns {job} at once")
            check(started["notices"] == [], "no notice yet")

            waited = body(await session.call_tool("wait", {"ids": [job], "until": "compiling", "timeout_s": 20}))
            check(waited["reason"] == "matched", "wait until a pattern")
            read = body(await session.call_tool("read", {"id": job}))
            check(read["output"] == "compiling\n" and read["running"], "read returns what is new")

            body(await session.call_tool("send", {"id": job, "text": "\\n"}))
            progress = []

            async def on_progress(done, total, message):
                progress.append(done)

            ended = body(await session.call_tool(
                "wait", {"ids": [job], "timeout_s": 20}, progress_callback=on_progress))
            check(ended["reason"] == "ended" and ended["items"][0]["end"] == "failed", "wait sees the end")
            check("1 failed" in ended["tails"][job], "the wait carries the last lines")

            other = body(await session.call_tool("start", {"command": "echo second; exit 0", "notify": True, "window_ms": 0}))
            listed = body(await session.call_tool("wait", {"id": other["id"], "timeout_s": 20}))
            check(listed["reason"] == "ended", "second job ended")
            third = body(await session.call_tool("start", {"command": "exit 0", "notify": True, "window_ms": 0}))
            seen = list(third["notices"])  # it may have ended before its own reply
            for _ in range(600):
                result = body(await session.call_tool("list", {}))
                seen.extend(result["notices"])
                if seen:
                    break
                await asyncio.sleep(0.05)
            items = [n["item"] for n in seen]
            check(items == [third["id"]], f"the notice rides along on the next result ({items})")
            check(seen[0]["text"].endswith("finished successfully (exit 0)"), "with its one-line report")
            again = body(await session.call_tool("notices", {}))
            check(again["notices"] == [], "each notice once")

            error = await session.call_tool("read", {"id": "bg-999"})
            check(field(error, "is_error", "isError"), "an unknown id is a tool error")
            code = field(error, "structured_content", "structuredContent")["error"]["code"]
            check(code == "unknown_id", "with the code of the contract")
            stop = body(await session.call_tool("start", {"command": "sleep 1000", "window_ms": 0}))
            slow = body(await session.call_tool(
                "wait", {"ids": [stop["id"]], "timeout_s": 1}, progress_callback=on_progress))
            check(slow["reason"] == "timeout", "a bounded wait times out")
            check(len(progress) >= 1, f"a long wait sends progress ({len(progress)} notifications)")
            stopped = body(await session.call_tool("stop", {"id": stop["id"], "grace_s": 1}))
            check(stopped["end"] == "stopped_by_agent", "stop ends it")
            check("log_path" not in stopped and "cwd" not in stopped, "item results are short")
            again = body(await session.call_tool("stop", {"id": stop["id"], "verbose": True}))
            check(again["already_ended"] and again["cwd"], "verbose keeps cwd; a second stop says it had ended")

            error = await session.call_tool("stop", {"id": "bg-999"})
            message = field(error, "structured_content", "structuredContent")["error"]["message"]
            check("`list` tool" in message and "bgwork list" not in message, f"errors speak of tools ({message})")

            ran = body(await session.call_tool("run", {"command": "printf 'v%s' $((40+2))", "timeout_s": 20}))
            redo = body(await session.call_tool("restart", {"id": ran["id"], "window_ms": 5000}))
            check(redo["restarted"] == ran["id"] and redo["output"] == "v42", "restart runs the command again")
            gone = body(await session.call_tool("dismiss", {"ids": [ran["id"], redo["id"]]}))
            check(gone["ok"], "dismiss takes several ids")
            pane = body(await session.call_tool("start", {"command": "cat", "pty": True, "window_ms": 0}))
            body(await session.call_tool("resize", {"id": pane["id"], "cols": 80, "rows": 20}))
            body(await session.call_tool("stop", {"id": pane["id"], "grace_s": 1}))
            agent = body(await session.call_tool("agent_start", {"command": "echo done > \"$BGWORK_REPORT\""}))
            check(agent["id"].startswith("sub-"), "agent_start starts a sub-agent")

    # A server given no session names one after the client and its folder.
    project = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"interop-project-{os.getpid()}")
    os.makedirs(project, exist_ok=True)
    env = dict(os.environ)
    env.pop("BGWORK_SESSION", None)
    params = StdioServerParameters(command=binary, args=["mcp"], env=env, cwd=project)
    client = types.Implementation(name="Interop Client", version="1")
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, client_info=client) as session:
            await session.initialize()
            body(await session.call_tool("start", {"command": "sleep 30", "window_ms": 0}))
            every = subprocess.run([binary, "--json", "list", "--all-sessions"], env=env,
                                   capture_output=True, text=True, check=True)
            sessions = {item["session"] for item in json.loads(every.stdout)["items"]}
            name = f"interop-client@interop-project-{os.getpid()}"
            check(name in sessions, f"the session is named {name} ({sorted(sessions)})")
            body(await session.call_tool("list", {}))
    os.rmdir(project)

    # This process stands in for a harness: its hook (run through a shell, as a harness
    # runs hooks) speaks for the session "interop-harness", and the MCP servers it
    # starts join that session, a restarted one too.
    hook_event = {"session_id": "interop-harness", "hook_event_name": "SessionStart",
                  "cwd": os.getcwd(), "source": "startup"}
    hooked = subprocess.run(["sh", "-c", f"'{binary}' hook claude-code"], env=env,
                            input=json.dumps(hook_event), capture_output=True, text=True)
    check(hooked.returncode == 0, "the SessionStart hook ran")
    async with stdio_client(StdioServerParameters(command=binary, args=["mcp"], env=env)) as (read, write):
        async with ClientSession(read, write, client_info=client) as session:
            await session.initialize()
            job = body(await session.call_tool("start", {"command": "sleep 0.3; echo via-mcp; exit 3",
                                                         "notify": True, "window_ms": 0}))["id"]
    seen = subprocess.run([binary, "--json", "list", "--all", "--session", "interop-harness"], env=env,
                          capture_output=True, text=True, check=True)
    check(job in [i["id"] for i in json.loads(seen.stdout)["items"]],
          "work started through MCP is the hooks' session's")
    async with stdio_client(StdioServerParameters(command=binary, args=["mcp"], env=env)) as (read, write):
        async with ClientSession(read, write, client_info=client) as session:
            await session.initialize()
            ended = body(await session.call_tool("wait", {"id": job, "timeout_s": 20}))
            check(ended["reason"] == "ended", "a restarted server still knows the job")
    later = subprocess.run([binary, "--json", "notices", "--session", "interop-harness"], env=env,
                           capture_output=True, text=True, check=True)
    check(json.loads(later.stdout)["notices"] == [], "the wait that showed the end delivered it")
    print("interop session passed", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
