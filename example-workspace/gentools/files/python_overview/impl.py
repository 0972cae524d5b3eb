from mcptools.filesystem import list_directory, read_text_file

from .api import Overview, PythonFile


def overview(path: str) -> Overview:
    listing = list_directory.run_parsed(list_directory.Params(path=path))
    files = []
    for name in listing.files:
        if name.endswith(".py"):
            head = read_text_file.run(read_text_file.Params(path=f"{path}/{name}", head=1)).content
            files.append(PythonFile(name=name, first_line=head.strip()))
    return Overview(directories=listing.directories, python_files=files)
